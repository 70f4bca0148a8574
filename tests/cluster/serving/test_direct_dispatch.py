"""Direct dispatch without Ray: the router sends requests to replicas on TCP links of its own
(``replica_link.py`` → ``submit_server.py``), their outputs come back on the real stream channel, and
each request's tokens arrive in order, exactly once, however many streams share the links; a client
that leaves aborts its request on its replica and no other; a replica whose link breaks before the
first output has its requests re-sent to another; with no replica known, Serve's handle is used."""

from __future__ import annotations

import asyncio
import random

from cluster.routing.direct_dispatch import DirectDispatch
from cluster.routing.stream_receiver import StreamReceiver
from cluster.serving.stream_channel import ChannelSet
from cluster.serving.stream_frames import encode, read_frame
from cluster.serving.submit_server import SubmitServer
from cluster.serving.wire import GenerateArgs
from tests.cluster.routing.test_stream_channel import (
    ChannelReplicas,
    PacedOutputs,
    _job,
    _leave_after,
    _read,
    _runner,
    _tokens,
)


class Replica:
    """A replica's direct end: a submit server running ``PacedOutputs`` on a real channel set."""

    def __init__(self, rid: str, seed: int, stats: dict | None = None) -> None:
        self.rid = rid
        self.paced = PacedOutputs(random.Random(seed))
        self.channels = ChannelSet()
        self.ran: list[str] = []
        self.stats = stats or {}
        self.server = SubmitServer(self._run, lambda: dict(self.stats))

    async def _run(self, args: GenerateArgs) -> dict:
        self.ran.append(args.request_id)
        return await self.channels.forward(args, self.paced.outputs(args))

    def board(self) -> dict:
        return {"model": "m", "submit_address": self.server.address, "submit_key": self.server.key}

    async def stop(self) -> None:
        await self.server.stop()
        await self.channels.close()


async def _setup(*replicas: Replica, known: bool = True):
    receiver = StreamReceiver()
    await receiver.start()
    for replica in replicas:
        await replica.server.start()
    handle = ChannelReplicas(PacedOutputs(random.Random(99)))  # Serve's path, the fallback
    runner = _runner(handle, receiver)
    direct = DirectDispatch("m", "load")
    if known:
        direct.update({r.rid: r.board() for r in replicas}, None)
    runner.direct = direct
    return receiver, handle, runner, direct


async def _teardown(receiver, handle, direct, *replicas: Replica) -> None:
    await direct.stop()
    for replica in replicas:
        await replica.stop()
    await handle.channels.close()
    await receiver.stop()


async def test_many_streams_over_two_links_get_every_token_in_order_exactly_once() -> None:
    a, b = Replica("a", 1), Replica("b", 2)
    receiver, handle, runner, direct = await _setup(a, b)
    rng = random.Random(4)
    lengths = [rng.randint(1, 50) for _ in range(120)]
    results = await asyncio.gather(*(_read(runner, _job(runner, i, n)) for i, n in enumerate(lengths)))
    for n, items in zip(lengths, results, strict=True):
        assert _tokens(items) == list(range(n))
        assert items[-1]["done"] and not any(i["done"] for i in items[:-1])
    assert handle.calls == []  # nothing went through Serve
    assert len(a.ran) + len(b.ran) == 120 and a.ran and b.ran  # both replicas took work
    assert a.server.frames + b.server.frames < 120  # a tick's sends leave as one frame
    assert direct.sent == 120 and runner.dispatcher.in_flight == 0 and receiver.open_streams == 0
    assert all(r.outcome == "ok" for r in runner.recorder.records())
    await _teardown(receiver, handle, direct, a, b)


async def test_a_client_that_leaves_aborts_its_request_on_its_replica_only() -> None:
    a = Replica("a", 5)
    receiver, handle, runner, direct = await _setup(a)

    leaving = asyncio.create_task(_leave_after(runner, _job(runner, 0, 400), 3))
    staying = [asyncio.create_task(_read(runner, _job(runner, i, 60))) for i in range(1, 25)]
    got = await leaving
    results = await asyncio.gather(*staying)
    await asyncio.sleep(0.05)  # the cancel frame reaches the replica
    assert a.paced.aborted == {"req-0"}
    assert _tokens(got) == list(range(len(_tokens(got))))
    assert all(_tokens(items) == list(range(60)) for items in results)
    assert a.server.in_flight == 0
    await _teardown(receiver, handle, direct, a)


async def test_requests_on_a_broken_link_go_to_another_replica_before_their_first_token() -> None:
    class Stalled(Replica):
        async def _run(self, args: GenerateArgs) -> dict:
            self.ran.append(args.request_id)
            await asyncio.sleep(3600)  # never answers: its link breaks first
            return {"ok": True}

    busy = {"waiting_tokens": 10**6, "running": 50}
    dead, alive = Stalled("dead", 1, {"waiting_tokens": 0}), Replica("alive", 2, busy)
    receiver, handle, runner, direct = await _setup(dead, alive)
    await direct.refresh_stats()  # the dead one looks idle: it is chosen first
    readers = [asyncio.create_task(_read(runner, _job(runner, i, 20))) for i in range(6)]
    while len(dead.ran) < 6:
        await asyncio.sleep(0.01)
    await dead.server.stop()  # its process dies: every connection ends
    results = await asyncio.gather(*readers)
    assert all(_tokens(items) == list(range(20)) for items in results)
    assert sorted(alive.ran) == sorted(f"req-{i}-r1" for i in range(6))  # re-sent under fresh ids
    assert direct.replicas == ["alive"] and handle.calls == []
    await _teardown(receiver, handle, direct, dead, alive)


async def test_the_choice_follows_the_stats_asked_on_the_links() -> None:
    busy = Replica("busy", 1, {"waiting_tokens": 50_000, "running": 3, "waiting": 40})
    idle = Replica("idle", 2, {"waiting_tokens": 0})
    receiver, handle, runner, direct = await _setup(busy, idle)
    await direct.refresh_stats()
    await asyncio.gather(*(_read(runner, _job(runner, i, 5)) for i in range(4)))
    assert busy.ran == [] and len(idle.ran) == 4
    await _teardown(receiver, handle, direct, busy, idle)


async def test_with_no_replica_known_requests_go_through_serve() -> None:
    a = Replica("a", 1)
    receiver, handle, runner, direct = await _setup(a, known=False)
    items = await _read(runner, _job(runner, 3, 8))
    assert _tokens(items) == list(range(8)) and handle.calls == ["req-3"] and a.ran == []
    await _teardown(receiver, handle, direct, a)


async def test_a_connection_without_the_key_runs_nothing() -> None:
    a = Replica("a", 1)
    await a.server.start()
    reader, writer = await asyncio.open_connection(*a.server.address.rsplit(":", 1))
    args = GenerateArgs("x", [1], {"max_tokens": 2}, reply_to="127.0.0.1:1", channel_key="k")
    writer.write(encode("wrong") + encode([["generate", args.as_wire()]]))
    assert await reader.read() == b""  # dropped
    assert a.ran == []
    writer.close()
    await a.stop()


async def test_a_malformed_request_drops_only_that_connection() -> None:
    a = Replica("a", 1, {"waiting_tokens": 7})
    await a.server.start()
    reader, writer = await asyncio.open_connection(*a.server.address.rsplit(":", 1))
    writer.write(encode(a.server.key) + encode([["generate", ["too", "short"]]]))
    assert await reader.read() == b""
    reader, writer2 = await asyncio.open_connection(*a.server.address.rsplit(":", 1))
    writer2.write(encode(a.server.key) + encode([["stats", "t1"]]))
    assert await read_frame(reader) == [["t1", {"waiting_tokens": 7}]]
    writer.close()
    writer2.close()
    await a.stop()


async def test_a_replica_off_the_board_takes_nothing_new_and_keeps_its_streams() -> None:
    """A replica whose board entry went stale (its GCS writes late) may still be serving: its open
    requests finish on their link; new ones go elsewhere; the link closes once they have ended."""
    a, b = Replica("a", 1, {"waiting_tokens": 0}), Replica("b", 2, {"waiting_tokens": 10**6, "running": 50})
    receiver, handle, runner, direct = await _setup(a, b)
    await direct.refresh_stats()
    long = asyncio.create_task(_read(runner, _job(runner, 0, 300)))
    while not a.ran:
        await asyncio.sleep(0.01)
    direct.update({"b": b.board()}, None)  # a is off the board
    assert direct.replicas == ["b"]
    items = await _read(runner, _job(runner, 1, 5))
    assert _tokens(items) == list(range(5)) and b.ran == ["req-1"]
    assert _tokens(await long) == list(range(300))  # not cut by the board
    direct.update({"b": b.board()}, None)
    await asyncio.sleep(0)
    assert "a" not in direct._replicas  # nothing pending: its link is closed
    await _teardown(receiver, handle, direct, a, b)


async def test_a_replica_serve_stops_takes_nothing_new_before_the_next_board_read() -> None:
    """The set Serve routes to is read at every choice: the moment a replica leaves it (Serve is
    stopping it), new requests go to the others, board or no board."""
    a, b = Replica("a", 1, {"waiting_tokens": 0}), Replica("b", 2, {"waiting_tokens": 10**6, "running": 50})
    receiver, handle, runner, direct = await _setup(a, b)
    await direct.refresh_stats()
    live = {"ids": frozenset({"a", "b"})}
    direct.follow_live(lambda: live["ids"])
    await _read(runner, _job(runner, 0, 3))
    assert a.ran == ["req-0"]  # the cheaper replica while both run
    live["ids"] = frozenset({"b"})  # Serve stops a; no board read since
    assert direct.replicas == ["b"]
    items = await _read(runner, _job(runner, 1, 3))
    assert _tokens(items) == [0, 1, 2] and b.ran == ["req-1"] and a.ran == ["req-0"]
    await _teardown(receiver, handle, direct, a, b)
