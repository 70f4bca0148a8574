"""The room per replica when it follows the engines: the slots each replica reports.

A replica's load (``ReplicaServer.load``) carries its engine's sizes (``replica/engine_sizes.py``):
its ``max_num_seqs`` are the requests it runs at once. With no ``replica_room`` set, a router's
room per replica is the fewest slots among the replicas it has heard from, so no replica is sent
more than it runs. A room set above the slots an engine chose by itself is clamped to them, once,
with a warning (a room set above slots that were set is refused when the config is validated).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


class RoomFollower:
    """Works out one model's room per replica from the loads its replicas report."""

    def __init__(self, model: str, room_set: int | None) -> None:
        self.model = model
        self.room_set = room_set
        self.slots: int | None = None  # the fewest slots reported; None until a replica reports
        self.clamped = False  # the room set was above the slots and is clamped to them

    def room(self, loads: Mapping[str, Mapping[str, Any]]) -> int | None:
        """The room per replica from the replicas' last loads; None while none reported its sizes."""
        reported = [int(load["engine"]["max_num_seqs"]) for load in loads.values() if load.get("engine")]
        if not reported:
            return self.room_set
        self.slots = min(reported)
        room, clamped = room_for(self.room_set, self.slots)
        if clamped and not self.clamped:
            log.warning(
                "model %s: replica_room %d is larger than the %d slots its replicas' engines chose; "
                "the room is clamped to %d (set engine.max_num_seqs, or leave replica_room unset)",
                self.model, self.room_set, self.slots, room,
            )  # fmt: skip
        self.clamped = clamped
        return room

    def state(self) -> dict[str, Any]:
        """For ``/admin/state`` and ``/health``: where the room comes from."""
        return {"room_set": self.room_set, "engine_slots": self.slots, "room_source": room_source(self)}


def room_for(room_set: int | None, slots: int) -> tuple[int, bool]:
    """The room per replica over engines of ``slots`` slots, and whether a room set was clamped."""
    if room_set is None:
        return slots, False
    return min(room_set, slots), room_set > slots


def room_source(follower: RoomFollower) -> str:
    if follower.room_set is None:
        return "engine slots"
    return "set, clamped to the engine slots" if follower.clamped else "set"
