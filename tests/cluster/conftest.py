"""One Ray instance and one running Serve app shared by every cluster test (start-up is the cost)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.cluster.helpers import ALICE, MODEL, ray_and_serve, start_app, write_tenancy
from tests.redis_server import free_port

REPO = str(Path(__file__).resolve().parents[2])
APP = "fl-test"


@pytest.fixture(scope="session")
def ray_serve() -> Iterator[int]:
    """Ray and Serve on a free port, for the whole session."""
    with ray_and_serve(free_port()) as port:
        yield port


@pytest.fixture(scope="session")
def tenancy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tenancy(tmp_path_factory.mktemp("tenancy") / "tenants.yaml")


@pytest.fixture(scope="session")
def app_config(tenancy_file: Path) -> dict:
    return {
        "engine": {"device": "cpu", "kv_cache_tokens": 16384, "max_num_seqs": 16},
        "tenancy_config": str(tenancy_file),
        "replica_room": 2,
        "load_poll_interval_s": 0.5,
        # The default 60 s wait bound is a serving figure; a slow 2-core box clears a flood's
        # backlog slower than that, and a 503 there would test the box, not the router.
        "queue_timeout_s": 600.0,
    }


@pytest.fixture(scope="session")
def base_url(ray_serve: int, app_config: dict) -> str:
    """The shared app: one router, in-memory quotas, one SmolLM2 replica on CPU."""
    start_app(APP, "/", app_config)
    return f"http://127.0.0.1:{ray_serve}"


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    """The real ``openai`` client, as alice."""
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=ALICE, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
async def engine():
    """The engine alone, in this process: the reference for what the API returns."""
    from replica import Engine, EngineConfig

    eng = Engine(EngineConfig(model=MODEL, device="cpu", kv_cache_tokens=4096))
    await eng.start()
    yield eng
    await eng.stop()
