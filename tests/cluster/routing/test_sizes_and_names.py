"""What a config that names only its model gets (no Ray): the model's own name in the API, a room
that follows the engines' slots, a room above the slots refused or clamped, and streamed outputs
held on the replica only as the router's item budget needs."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from cluster.config import AppConfig
from cluster.routing.dispatcher import Dispatcher
from cluster.routing.replica_monitor import ReplicaMonitor
from cluster.routing.request_flow import channel_flush
from cluster.routing.room_follower import RoomFollower
from tenancy import FairQueue, default_tenancy_config


def test_a_config_naming_only_its_model_serves_it_under_its_own_name(tmp_path) -> None:
    checkpoint = tmp_path / "Qwen2.5-7B-Instruct"
    checkpoint.mkdir()
    assert AppConfig().served_model_name == "smollm2-135m"  # the embedded default, as before
    assert AppConfig(engine={"model": "llama-3.1-8b"}).served_model_name == "llama-3.1-8b"
    config = AppConfig(engine={"model": f"{checkpoint}/"})
    assert config.served_model_name == "Qwen2.5-7B-Instruct"
    assert [m.name for m in config.served_models] == ["Qwen2.5-7B-Instruct"]
    # Dumped and validated again (the routers get it so): the same name.
    assert AppConfig.model_validate(config.model_dump()).served_model_name == "Qwen2.5-7B-Instruct"
    # A name given is kept.
    assert AppConfig(engine={"model": "llama-3.1-8b"}, served_model_name="x").served_model_name == "x"


def test_each_model_entry_without_a_name_takes_its_model_s_own(tmp_path) -> None:
    config = AppConfig.model_validate(
        {
            "engine": {"device": "cpu"},
            "models": [
                {"engine": {"model": str(tmp_path / "my tune")}},
                {"engine": {"model": "llama-3.2-1b"}},
            ],
        }
    )
    assert [m.name for m in config.served_models] == ["my-tune", "llama-3.2-1b"]
    assert config.served_model_name == "my-tune"


def test_a_room_above_the_slots_set_is_refused_at_start() -> None:
    with pytest.raises(
        ValidationError, match=r"replica_room \(16\) is larger than engine.max_num_seqs \(8\)"
    ):
        AppConfig(engine={"max_num_seqs": 8}, replica_room=16)
    with pytest.raises(ValidationError, match=r"larger than engine\.max_num_seqs"):
        AppConfig.model_validate(
            {"models": [{"name": "a", "engine": {"max_num_seqs": 2}, "replica_room": 4}]}
        )
    assert AppConfig(engine={"max_num_seqs": 8}, replica_room=8).replica_room == 8


def test_unset_sizes_leave_the_room_to_the_replicas_reports() -> None:
    (model,) = AppConfig().served_models
    assert model.replica_room is None and model.engine.max_num_seqs is None
    assert model.room_hint == 8  # until a replica reports: a CPU engine's slots
    assert model.replica_max_ongoing >= 128  # Serve never caps below the most slots an engine chooses
    (set_model,) = AppConfig(engine={"max_num_seqs": 64}).served_models
    assert set_model.room_hint == 64


def _load(replica: str, slots: int) -> dict:
    return {"replica_id": replica, "engine": {"max_num_seqs": slots}}


def test_the_room_follows_the_fewest_slots_reported() -> None:
    follower = RoomFollower("m", room_set=None)
    assert follower.room({}) is None
    assert follower.room({"r1": _load("r1", 128)}) == 128
    assert follower.room({"r1": _load("r1", 128), "r2": _load("r2", 64)}) == 64
    assert follower.state() == {"room_set": None, "engine_slots": 64, "room_source": "engine slots"}


def test_a_room_set_above_chosen_slots_is_clamped_with_one_warning(caplog) -> None:
    follower = RoomFollower("m", room_set=32)
    with caplog.at_level(logging.WARNING, logger="cluster.routing.room_follower"):
        assert follower.room({"r1": _load("r1", 8)}) == 8
        assert follower.room({"r1": _load("r1", 8)}) == 8
    warnings = [r for r in caplog.records if "clamped" in r.getMessage()]
    assert len(warnings) == 1 and "replica_room 32" in warnings[0].getMessage()
    assert follower.state()["room_source"] == "set, clamped to the engine slots"
    assert RoomFollower("m", room_set=4).room({"r1": _load("r1", 8)}) == 4  # below the slots: kept


class _Handle:
    app_name, deployment_name = "sizes-test", "Replica"

    def __init__(self, slots: int) -> None:
        self.load = SimpleNamespace(remote=self._load)
        self.slots = slots

    async def _load(self) -> dict:
        return _load("r1", self.slots)


async def test_the_monitor_sets_the_dispatcher_room_from_the_replica_s_load() -> None:
    dispatcher = Dispatcher(FairQueue.from_config(default_tenancy_config()), 8, replicas=1)
    handle = _Handle(slots=128)
    monitor = ReplicaMonitor(handle, dispatcher, _metrics(), 0.05, lambda: (1, 1), model="m")
    await monitor.poll_once()
    assert dispatcher.room == 128 and dispatcher.capacity == 128
    handle.slots = 64  # a replica with a smaller pool took its place
    monitor.loads.clear()
    await monitor.poll_once()
    assert dispatcher.capacity == 64


def _metrics():
    from cluster.telemetry.metrics import ClusterMetrics

    return ClusterMetrics()


def test_streams_are_held_only_as_the_item_budget_needs() -> None:
    ceiling = 0.02
    assert channel_flush(ceiling, open_streams=2, items_per_s=1000) == pytest.approx(0.002)
    assert channel_flush(ceiling, open_streams=0, items_per_s=1000) == 0.0
    assert channel_flush(ceiling, open_streams=10, items_per_s=1000) == pytest.approx(0.01)
    assert channel_flush(ceiling, open_streams=500, items_per_s=1000) == ceiling  # never coarser
    assert channel_flush(ceiling, open_streams=500, items_per_s=0) == 0.0  # no budget: never held
