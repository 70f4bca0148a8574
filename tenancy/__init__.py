"""fairlane tenancy layer: tenant config, API-key auth, quotas, fair-share queue, state stores."""

from tenancy.admission import QuotaManager
from tenancy.auth import Authenticator, parse_bearer
from tenancy.config import FairShareSettings, ModelQuotas, Quotas, SLAClass, TenancyConfig, Tenant
from tenancy.dispatch_policy import DISPATCH_POLICIES, DispatchPolicy
from tenancy.errors import (
    AuthenticationError,
    InvalidQueueItem,
    KeySaltError,
    QueueFull,
    QueueWaitTooLong,
    QuotaExceeded,
    RequestLimitExceeded,
    TenancyConfigError,
    TenancyError,
    UnknownTenantError,
)
from tenancy.fair_queue import FairQueue
from tenancy.keys import hash_api_key
from tenancy.lease import Lease
from tenancy.loader import (
    DEMO_ADMIN_KEY,
    DEMO_KEY_SALT,
    DEMO_KEYS,
    default_tenancy_config,
    load_tenancy_config,
)
from tenancy.memory_store import MemoryQuotaStore
from tenancy.queue_snapshot import FairQueueSnapshot, TenantQueueStats
from tenancy.queued_request import QueuedRequest, TenantPolicy, policies_from_config
from tenancy.ratelimit_headers import RateLimitState, format_reset, ratelimit_headers
from tenancy.redis_store import RedisQuotaStore
from tenancy.store import AcquireResult, LimitSpec, QuotaStore, SyncQuotaStore

__all__ = [
    "DEMO_ADMIN_KEY",
    "DEMO_KEYS",
    "DEMO_KEY_SALT",
    "DISPATCH_POLICIES",
    "AcquireResult",
    "AuthenticationError",
    "Authenticator",
    "DispatchPolicy",
    "FairQueue",
    "FairQueueSnapshot",
    "FairShareSettings",
    "InvalidQueueItem",
    "KeySaltError",
    "Lease",
    "LimitSpec",
    "MemoryQuotaStore",
    "ModelQuotas",
    "QueueFull",
    "QueueWaitTooLong",
    "QueuedRequest",
    "QuotaExceeded",
    "QuotaManager",
    "QuotaStore",
    "Quotas",
    "RateLimitState",
    "RedisQuotaStore",
    "RequestLimitExceeded",
    "SLAClass",
    "SyncQuotaStore",
    "TenancyConfig",
    "TenancyConfigError",
    "TenancyError",
    "Tenant",
    "TenantPolicy",
    "TenantQueueStats",
    "UnknownTenantError",
    "default_tenancy_config",
    "format_reset",
    "hash_api_key",
    "load_tenancy_config",
    "parse_bearer",
    "policies_from_config",
    "ratelimit_headers",
]
