"""The cluster's configuration: one pydantic model, validated once by ``build_app``, then frozen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import model_validator

from cluster.app_settings import AppSettings
from cluster.model_settings import (
    DEFAULT_MODEL,
    AutoscalingSettings,
    EngineSettings,
    ModelSettings,
    check_room,
    check_unique,
    deployment_names,
    inherit_entries,
    model_name_of,
)

# The longest answer a replica may be asked for when ``engine.max_model_len`` is None: the engine's
# own context cap (``replica.engine.MAX_CONTEXT_CAP``; not imported: that would load torch here).
ENGINE_CONTEXT_CAP = 8192
# The slowest decode, per stream, that a replica's stop still waits out: below 10 tokens/s even the
# interactive class's TPOT target (0.1 s) is missed. A slower (CPU) replica needs a larger bound.
SLOWEST_DECODE_TOKENS_PER_S = 10.0
__all__ = ["AppConfig", "AutoscalingSettings", "EngineSettings", "ModelSettings", "load_app_config"]


class AppConfig(AppSettings):
    """The whole Serve application: engine, replicas, routers, tenancy, queue bounds and HTTP."""

    @model_validator(mode="before")
    @classmethod
    def _complete_models(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("models") and data.get("served_model_name") is None:
            data = {**data, "served_model_name": model_name_of(_engine_model(data.get("engine")))}
        if not isinstance(data, dict) or not data.get("models"):
            return data
        data = inherit_entries(data)
        names = [m.get("name") if isinstance(m, dict) else getattr(m, "name", None) for m in data["models"]]
        # served_model_name names the first model unless given (then it must name one of them).
        data.setdefault("served_model_name", names[0])
        if data["served_model_name"] not in names:
            raise ValueError(f"served_model_name: {data['served_model_name']!r} is not one of the models")
        return data

    @model_validator(mode="after")
    def _room_fits(self) -> AppConfig:
        check_room(self.replica_room, self.engine.max_num_seqs)
        return self

    @model_validator(mode="after")
    def _unique_models(self) -> AppConfig:
        check_unique(self.served_models)
        return self

    @model_validator(mode="after")
    def _direct_dispatch_fits(self) -> AppConfig:
        # Its outputs come back on the stream channel. (With autoscaling, replicas are scaled on
        # their engines' own counts: cluster/serving/engine_load_policy.py.)
        if self.direct_dispatch and not self.stream_channel:
            raise ValueError("direct_dispatch needs stream_channel: true")
        return self

    @model_validator(mode="after")
    def _routers_share_state(self) -> AppConfig:
        # Each router alone would grant every tenant its whole quota: N routers, N times over.
        if self.router_autoscaling and self.router_autoscaling.max_routers > 1 and not self.redis_url:
            raise ValueError("router_autoscaling with max_routers > 1 needs redis_url (shared quota state)")
        return self

    @property
    def initial_routers(self) -> int:
        """Routers the app starts with (the count until the routers' own poll sees the running ones)."""
        return self.router_autoscaling.first if self.router_autoscaling else self.num_routers

    @property
    def most_routers(self) -> int:
        return self.router_autoscaling.max_routers if self.router_autoscaling else self.num_routers

    @property
    def served_models(self) -> tuple[ModelSettings, ...]:
        """Every served model, resolved: the ``models`` list, or the one model of the top-level fields."""
        if self.models:
            return self.models
        # Constructed, not validated: the fields were validated here, and the single form's name keeps
        # the wider rule it always had (it never enters a Redis key: one model needs no namespace).
        single = ModelSettings.model_construct(
            name=self.served_model_name,
            engine=self.engine,
            num_replicas=self.num_replicas,
            autoscaling=self.autoscaling,
            replica_num_cpus=self.replica_num_cpus,
            replica_num_gpus=self.replica_num_gpus,
            replica_room=self.replica_room,
            tool_call_parser=self.tool_call_parser,
        )
        return (single,)

    @property
    def deployments(self) -> dict[str, str]:
        """Served model name -> its replica deployment's name."""
        return deployment_names(self.served_models)

    @property
    def min_replicas(self) -> int:
        return self.autoscaling.min_replicas if self.autoscaling else self.num_replicas

    @property
    def fallback_fraction(self) -> float:
        # 1/N keeps N routers together near the quota during a Redis outage (one refill window at most).
        return self.redis_fallback_fraction or 1.0 / self.most_routers

    @property
    def graceful_shutdown_s(self) -> float:
        """How long a stopping replica or router waits for its in-flight requests.

        The derived default covers a maximum-length answer: the first-token wait, then every
        token of the context at the slowest decode served. It is a cap, not a delay: the stop ends
        when the last stream does, and a stream that stalls is ended by the router's
        ``token_timeout_s``, which cancels it on the replica too.
        """
        if self.replica_graceful_shutdown_s is not None:
            return self.replica_graceful_shutdown_s
        longest = max(m.engine.max_model_len or ENGINE_CONTEXT_CAP for m in self.served_models)
        return self.first_token_timeout_s + longest / SLOWEST_DECODE_TOKENS_PER_S


def _engine_model(engine: Any) -> str:
    """The model an (unvalidated) engine setting names: the default preset when it names none."""
    model = engine.get("model") if isinstance(engine, dict) else getattr(engine, "model", None)
    return model if isinstance(model, str) else DEFAULT_MODEL


def load_app_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> AppConfig:
    """Read a YAML app config (or none) and apply overrides; raises ValidationError. An override's key
    names a top-level field, or one field of a nested setting ("engine.late_launch")."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path}: the app config must be a mapping")
        data = dict(loaded or {})
    return AppConfig.model_validate(with_overrides(data, overrides or {}))


def with_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each override set: a top-level key, or one field of a nested setting
    ("engine.late_launch", the rest of ``engine`` kept)."""
    data = dict(data)
    for key, value in overrides.items():
        head, dot, field = key.partition(".")
        if dot:
            nested = data.get(head)
            data[head] = {**(nested if isinstance(nested, dict) else {}), field: value}
        else:
            data[key] = value
    return data
