"""Routers sharing a tenancy version (issue 19, defect 5), without Ray: the GCS key-value store is a
dict here. tests/cluster/ops/test_tenancy_reload.py runs the same on a Serve app with two routers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster.errors import BadRequest
from cluster.routing import tenancy_board
from cluster.routing.tenancy_sync import Deployment, TenancySync
from tenancy import DEMO_KEY_SALT, TenancyConfig, default_tenancy_config


class FakeKV:
    """The four ``internal_kv`` calls the board makes, on a dict."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def _internal_kv_put(self, key: bytes, value: bytes, overwrite: bool = True, namespace: str = "") -> None:
        self.data[key] = value

    def _internal_kv_get(self, key: bytes, namespace: str = "") -> bytes | None:
        return self.data.get(key)

    def _internal_kv_list(self, prefix: bytes, namespace: str = "") -> list[bytes]:
        return [k for k in self.data if k.startswith(prefix)]

    def _internal_kv_del(self, key: bytes, namespace: str = "") -> None:
        self.data.pop(key, None)


class Router:
    """One router's sync and what it enforces."""

    def __init__(self, name: str, path: Path, routers: int, generation: str = "g1") -> None:
        self.applied: list[TenancyConfig] = []
        where = Deployment("app", generation, name)
        self.sync = TenancySync(where, path, self.applied.append, lambda: routers, wait_s=0.3)


@pytest.fixture
def kv(monkeypatch: pytest.MonkeyPatch) -> FakeKV:
    fake = FakeKV()
    monkeypatch.setattr(tenancy_board, "internal_kv", fake)
    return fake


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    data = default_tenancy_config().model_dump(mode="json") | {"key_salt": DEMO_KEY_SALT}
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def drop_tenant(path: Path, tenant_id: str) -> None:
    data = yaml.safe_load(path.read_text())
    data["tenants"] = [t for t in data["tenants"] if t["id"] != tenant_id]
    path.write_text(yaml.safe_dump(data))


async def test_a_reload_reaches_the_other_router_and_says_when_it_has_not_yet(
    kv: FakeKV, tenants_file: Path
) -> None:
    a, b = Router("a", tenants_file, 2), Router("b", tenants_file, 2)
    start = await a.sync.initial()
    assert (await b.sync.initial()).version == start.version
    drop_tenant(tenants_file, "carol")

    partial = await a.sync.reload()  # b does not poll meanwhile: a answers after its wait
    assert partial.body() == {
        "status": "partial",
        "version": partial.version,
        "tenants": ["alice", "bob"],
        "routers": 2,
        "routers_applied": 1,
    }
    assert [t.id for t in a.applied[-1].tenants] == ["alice", "bob"] and b.applied == []

    await b.sync.poll()  # b's monitor loop
    assert b.sync.version == partial.version and [t.id for t in b.applied[-1].tenants] == ["alice", "bob"]
    again = await a.sync.reload()
    assert again.complete and again.version == partial.version and len(a.applied) == 1  # nothing new


async def test_a_bad_file_changes_nothing_anywhere(kv: FakeKV, tenants_file: Path) -> None:
    a, b = Router("a", tenants_file, 2), Router("b", tenants_file, 2)
    version = (await a.sync.initial()).version
    await b.sync.initial()
    before = dict(kv.data)
    tenants_file.write_text("tenants: [")
    with pytest.raises(BadRequest, match="invalid YAML") as caught:
        await a.sync.reload()
    assert caught.value.code == "invalid_tenancy_config"
    await b.sync.poll()
    assert kv.data == before and a.applied == b.applied == [] and b.sync.version == version


async def test_a_router_started_later_starts_from_the_published_one(kv: FakeKV, tenants_file: Path) -> None:
    a = Router("a", tenants_file, 1)
    await a.sync.initial()
    drop_tenant(tenants_file, "carol")
    published = (await a.sync.reload()).version
    drop_tenant(tenants_file, "bob")  # the file changes again, unreloaded
    late = await Router("c", tenants_file, 1).sync.initial()
    assert late.version == published and [t.id for t in late.config.tenants] == ["alice", "bob"]
    # A later deployment of the app starts from its own file, whatever an earlier one published.
    fresh = await Router("d", tenants_file, 1, generation="g2").sync.initial()
    assert [t.id for t in fresh.config.tenants] == ["alice"]
    assert tenancy_board.applied_by_routers("app", "g1") == {"a": published, "c": published}
    a.sync.forget()
    assert tenancy_board.applied_by_routers("app", "g1") == {"c": published}


async def test_a_file_naming_a_model_the_app_does_not_serve_changes_nothing(
    kv: FakeKV, tenants_file: Path
) -> None:
    served = ("small", "large")
    applied: list[TenancyConfig] = []
    sync = TenancySync(Deployment("app", "g1", "a"), tenants_file, applied.append, lambda: 1, 0.3, served)
    version = (await sync.initial()).version
    before = dict(kv.data)
    data = yaml.safe_load(tenants_file.read_text())
    data["tenants"][1]["models"] = ["small", "lareg"]  # a typo would lock bob out of "large" quietly
    tenants_file.write_text(yaml.safe_dump(data))
    with pytest.raises(BadRequest, match=r"tenants\.1\.models: 'lareg' is not a served model") as caught:
        await sync.reload()
    assert caught.value.code == "invalid_tenancy_config"
    assert kv.data == before and applied == [] and sync.version == version
    data["tenants"][1]["models"] = ["small", "large"]
    tenants_file.write_text(yaml.safe_dump(data))
    assert (await sync.reload()).complete and applied[-1].tenant("bob").models == ("small", "large")
