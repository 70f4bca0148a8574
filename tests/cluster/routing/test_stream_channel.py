"""The stream channel without Ray: replicas' outputs for many streams travel over one TCP connection
per router in frames, and each request's tokens arrive in order, exactly once; a request whose client
leaves is aborted on the replica and the others are untouched; a replica that fails before the first
output is retried. The Serve call is a task here (``FakeCall``), the channel and receiver are real.
Each of these holds for outputs pulled by the handler (``ActiveRequest.outputs``) and for outputs
pushed to it by the receiver (``PushedOutputs``, the direct-ingress answer's path)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cluster.errors import ReplicaFailure, ServiceUnavailable
from cluster.routing.dispatcher import Dispatcher
from cluster.routing.outcomes import ClientGone
from cluster.routing.pushed_outputs import PushedOutputs
from cluster.routing.request_flow import RequestRunner
from cluster.routing.request_job import Job, Timeouts
from cluster.routing.stream_receiver import StreamReceiver
from cluster.serving.stream_channel import ChannelSet
from cluster.serving.wire import GenerateArgs
from cluster.telemetry.metrics import ClusterMetrics
from cluster.telemetry.request_timing import TimingRecorder
from tenancy import FairQueue, MemoryQuotaStore, QuotaManager, TenancyConfig, default_tenancy_config


def _output(args: GenerateArgs, index: int, start: int, count: int, total: int, done: bool, n: int) -> dict:
    ids = list(range(start, start + count))
    finished = start + count == n
    return {
        "request_id": args.request_id, "index": index, "token_ids": ids,
        "text": "".join(f" w{t}" for t in ids),
        "finish_reason": "length" if finished else None, "num_prompt_tokens": 3,
        "num_output_tokens": start + count, "total_output_tokens": total, "done": done, "replica_id": "r",
    }  # fmt: skip


class PacedOutputs:
    """A replica's outputs for one request: ``max_tokens`` per choice at random gaps, a few tokens
    at a time; ``aborted`` when the stream is closed before its end (the engine's abort)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.aborted: set[str] = set()

    async def outputs(self, args: GenerateArgs) -> AsyncIterator[dict[str, Any]]:
        n, choices = int(args.sampling["max_tokens"]), int(args.sampling.get("n", 1))
        sent = [0] * choices
        try:
            while min(sent) < n:
                await asyncio.sleep(self._rng.uniform(0.0, 0.004))
                index = self._rng.choice([i for i in range(choices) if sent[i] < n])
                count = min(n - sent[index], self._rng.randint(1, 3))
                total = sum(sent) + count
                yield _output(args, index, sent[index], count, total, total == n * choices, n)
                sent[index] += count
        finally:
            if min(sent) < n:
                self.aborted.add(args.request_id)


class FakeCall:
    """A Serve unary call: awaitable for its answer, ``cancel`` cancels the replica's coroutine."""

    def __init__(self, coro) -> None:
        self.task = asyncio.ensure_future(coro)

    def __await__(self):
        return self.task.__await__()

    def cancel(self) -> None:
        self.task.cancel()


class ChannelReplicas:
    """A replica deployment handle whose ``generate_channel`` forwards ``PacedOutputs`` on a real channel;
    ``fail_first`` calls fail as a dead replica's would."""

    def __init__(self, paced: PacedOutputs, fail_first: int = 0) -> None:
        self.channels = ChannelSet()
        self.paced = paced
        self.fail_first = fail_first
        self.calls: list[str] = []
        self.sent: list[GenerateArgs] = []
        self.generate_channel = self

    def options(self, **_: object) -> ChannelReplicas:
        return self

    def remote(self, args: GenerateArgs) -> FakeCall:
        self.calls.append(args.request_id)
        self.sent.append(args)
        if len(self.calls) <= self.fail_first:
            return FakeCall(_dead())
        return FakeCall(self.channels.forward(args, self.paced.outputs(args)))


async def _dead() -> dict:
    raise RuntimeError("ActorDiedError")


def _runner(
    replicas: ChannelReplicas, receiver: StreamReceiver, room: int = 1000, token_s: float = 10.0
) -> RequestRunner:
    config = TENANCY
    quotas = QuotaManager(config, MemoryQuotaStore())
    dispatcher = Dispatcher(FairQueue.from_config(config), room_per_replica=room)
    runner = RequestRunner(
        quotas,
        dispatcher,
        replicas,
        ClusterMetrics(),
        TimingRecorder(),
        Timeouts(10.0, token_s, 2),  # type: ignore[arg-type]
    )
    runner.attach_channel(receiver, 0.01)
    return runner


def _tenancy() -> TenancyConfig:
    """The demo tenants with room for every stream of a test at once."""
    data = default_tenancy_config().model_dump()
    for tenant in data["tenants"]:
        tenant["quotas"]["max_concurrent_requests"] = 1000
    return TenancyConfig.model_validate(data)


TENANCY = _tenancy()
TENANTS = TENANCY.tenants


def _job(runner: RequestRunner, i: int, max_tokens: int, n: int = 1) -> Job:
    tenant = TENANTS[i % len(TENANTS)]
    sampling = {"max_tokens": max_tokens, "n": n}
    return Job(f"req-{i}", tenant, tenant.sla_class, [1, 2, 3], sampling, coalesce_s=0.05)


MODES = ["pulled", "pushed"]


async def until(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    """Wait until ``condition()`` holds (checked every few ms); fail after ``within_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not within {within_s} s")
        await asyncio.sleep(0.005)


async def _read(runner: RequestRunner, job: Job, mode: str = "pulled", got: list | None = None) -> list[dict]:
    """Every output of ``job``, into ``got`` (kept when the stream raises)."""
    got = [] if got is None else got
    active = await runner.open(job)
    if mode == "pulled":
        async for item in active.outputs():
            got.append(item)
    else:
        await PushedOutputs(active, got.append).run()
    return got


async def _leave_after(runner: RequestRunner, job: Job, count: int, mode: str = "pulled") -> list[dict]:
    """A client that reads ``count`` outputs, then goes."""
    active = await runner.open(job)
    got: list[dict] = []
    if mode == "pushed":

        def consume(item: dict) -> None:
            if len(got) == count:
                raise ClientGone  # what the response's writer raises for a closed connection
            got.append(item)

        with contextlib.suppress(ClientGone):
            await PushedOutputs(active, consume).run()
        return got
    stream = active.outputs()
    async for item in stream:
        got.append(item)
        if len(got) == count:
            break
    await stream.aclose()  # what the HTTP layer does when the client goes
    return got


def _tokens(items: list[dict], index: int = 0) -> list[int]:
    return [t for item in items if item["index"] == index for t in item["token_ids"]]


@pytest.mark.parametrize("mode", MODES)
async def test_many_streams_get_every_token_in_order_exactly_once(mode: str) -> None:
    receiver = StreamReceiver()
    await receiver.start()
    replicas = ChannelReplicas(PacedOutputs(random.Random(7)))
    runner = _runner(replicas, receiver)
    rng = random.Random(3)
    lengths = [rng.randint(1, 60) for _ in range(120)]
    jobs = [_job(runner, i, n) for i, n in enumerate(lengths)]
    results = await asyncio.gather(*(_read(runner, job, mode) for job in jobs))
    for n, items in zip(lengths, results, strict=True):
        assert _tokens(items) == list(range(n))  # in order, none lost, none twice
        assert items[-1]["done"] and not any(i["done"] for i in items[:-1])
    assert receiver.frames < receiver.outputs  # frames carried several streams' outputs at once
    assert receiver.open_streams == 0 and runner.dispatcher.in_flight == 0
    assert all(r.outcome == "ok" for r in runner.recorder.records())
    await replicas.channels.close()
    await receiver.stop()


async def test_the_hold_follows_the_open_streams_even_on_a_replica_serve_stopped_routing_to() -> None:
    """The hold asked of each new request is the item budget shared over the streams open on the
    channel, the new one included: a stream whose slot holds no room (its replica left Serve's
    running set) still costs the router an item per flush."""
    receiver = StreamReceiver()
    await receiver.start()
    replicas = ChannelReplicas(PacedOutputs(random.Random(5)))
    runner = _runner(replicas, receiver)
    runner._items_per_s = 1000.0
    runner.dispatcher.set_live(frozenset({"another-replica"}))  # the outputs name replica "r"
    readers = []
    for i in range(1, 7):
        readers.append(asyncio.ensure_future(_read(runner, _job(runner, i, 1000), "pushed")))
        await until(lambda n=i: len(replicas.sent) == n and receiver.open_streams == n)
    holds = [args.flush_s for args in replicas.sent]
    assert holds == pytest.approx([k / 1000 for k in range(1, 7)])
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    await replicas.channels.close()
    await receiver.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_several_choices_end_with_the_output_that_ends_the_request(mode: str) -> None:
    receiver = StreamReceiver()
    await receiver.start()
    replicas = ChannelReplicas(PacedOutputs(random.Random(11)))
    runner = _runner(replicas, receiver)
    results = await asyncio.gather(*(_read(runner, _job(runner, i, 40, n=3), mode) for i in range(20)))
    for items in results:
        assert [_tokens(items, c) for c in range(3)] == [list(range(40))] * 3
        assert items[-1]["done"] and items[-1]["total_output_tokens"] == 120
    await replicas.channels.close()
    await receiver.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_that_leaves_aborts_its_request_and_no_other(mode: str) -> None:
    receiver = StreamReceiver()
    await receiver.start()
    paced = PacedOutputs(random.Random(5))
    replicas = ChannelReplicas(paced)
    runner = _runner(replicas, receiver)

    leaving = asyncio.create_task(_leave_after(runner, _job(runner, 0, 400), 3, mode))
    staying = [asyncio.create_task(_read(runner, _job(runner, i, 80), mode)) for i in range(1, 30)]
    got = await leaving
    results = await asyncio.gather(*staying)
    async with asyncio.timeout(10):  # the replica's coroutine sees its cancellation
        while not paced.aborted:
            await asyncio.sleep(0.005)
    assert paced.aborted == {"req-0"}  # every other request has ended with its answer by now
    assert _tokens(got) == list(range(len(_tokens(got))))
    assert all(_tokens(items) == list(range(80)) for items in results)
    records = {r.request_id: r for r in runner.recorder.records()}
    assert records["req-0"].outcome == "aborted" and records["req-0"].reason == "client_gone"
    assert sum(r.outcome == "ok" for r in records.values()) == 29
    assert receiver.open_streams == 0 and runner.dispatcher.in_flight == 0
    await replicas.channels.close()
    await receiver.stop()


async def test_a_replica_that_fails_before_the_first_output_is_retried() -> None:
    receiver = StreamReceiver()
    await receiver.start()
    replicas = ChannelReplicas(PacedOutputs(random.Random(1)), fail_first=2)
    runner = _runner(replicas, receiver)
    items = await _read(runner, _job(runner, 9, 12))
    assert _tokens(items) == list(range(12))
    assert replicas.calls == ["req-9", "req-9-r1", "req-9-r2"]
    await replicas.channels.close()
    await receiver.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_an_error_answer_ends_the_stream_after_the_outputs_before_it(mode: str) -> None:
    receiver = StreamReceiver()
    await receiver.start()

    class Failing(PacedOutputs):
        async def outputs(self, args: GenerateArgs) -> AsyncIterator[dict[str, Any]]:
            yield _output(args, 0, 0, 2, 2, False, 10)
            yield {"error": {"kind": "engine_error", "message": "boom"}}

    replicas = ChannelReplicas(Failing(random.Random(0)))
    runner = _runner(replicas, receiver)
    got: list[dict] = []
    with pytest.raises(Exception) as caught:
        await _read(runner, _job(runner, 4, 10), mode, got)
    assert _tokens(got) == [0, 1] and not isinstance(caught.value, ReplicaFailure)
    [record] = runner.recorder.records()
    assert record.outcome == "error" and record.reason == "engine_error"
    await replicas.channels.close()
    await receiver.stop()


async def test_a_connection_without_the_key_reaches_no_stream() -> None:
    receiver = StreamReceiver()
    await receiver.start()
    queue_stream = receiver.open("req-x", FakeCall(asyncio.sleep(10)))
    channels = ChannelSet()
    args = GenerateArgs("req-x", [1], {"max_tokens": 1}, reply_to=receiver.address, channel_key="wrong")
    channel = channels.channel(receiver.address, "wrong", args.flush_s)  # the one ``forward`` uses

    async def one() -> AsyncIterator[dict[str, Any]]:
        yield _output(args, 0, 0, 1, 1, True, 1)

    answer = await channels.forward(args, one())
    # The receiver closed the connection (the replica saw its end): nothing more can come of it.
    await until(lambda: channel.broken is not None)
    assert receiver.frames == 0 and receiver.outputs == 0
    with pytest.raises(TimeoutError):
        await queue_stream.next(0.0)  # nothing queued for the stream
    assert answer.get("ok") or answer["error"]["kind"] == "channel_error"
    queue_stream.cancel()
    await channels.close()
    await receiver.stop()


async def test_a_wait_that_timed_out_leaves_nothing_behind() -> None:
    receiver = StreamReceiver()
    await receiver.start()
    stream = receiver.open("req-t", FakeCall(asyncio.sleep(10)))
    with pytest.raises(TimeoutError):
        await stream.next(0.02)
    await asyncio.sleep(0.05)
    channels = ChannelSet()
    args = GenerateArgs("req-t", [1], {"max_tokens": 2}, reply_to=receiver.address, channel_key=receiver.key)

    async def two() -> AsyncIterator[dict[str, Any]]:
        yield _output(args, 0, 0, 1, 1, False, 2)
        yield _output(args, 0, 1, 1, 2, True, 2)

    assert await channels.forward(args, two()) == {"ok": True}
    got = [await stream.next(1.0)]  # no marker of the wait that timed out is read as one
    while not got[-1]["done"]:
        got.append(await stream.next(1.0))
    assert _tokens(got) == [0, 1]
    stream.cancel()
    await channels.close()
    await receiver.stop()


async def test_a_router_that_stops_is_noticed_by_the_replica_at_once() -> None:
    receiver = StreamReceiver()
    await receiver.start()
    channels = ChannelSet()
    args = GenerateArgs("req-s", [1], {"max_tokens": 1}, reply_to=receiver.address, channel_key=receiver.key)
    stream = receiver.open("req-s", FakeCall(asyncio.sleep(10)))

    async def one() -> AsyncIterator[dict[str, Any]]:
        yield _output(args, 0, 0, 1, 1, True, 1)

    assert await channels.forward(args, one()) == {"ok": True}
    assert (await stream.next(1.0))["done"]
    channel = channels.channel(receiver.address, receiver.key, 0.01)
    assert channel.broken is None
    await receiver.stop()
    for _ in range(100):
        if channel.broken is not None:
            break
        await asyncio.sleep(0.01)
    assert isinstance(channel.broken, ConnectionError)
    again = channels.channel(receiver.address, receiver.key, 0.01)  # the next request: a fresh one
    assert again is not channel
    await channels.close()


async def test_a_pushed_stream_whose_replica_stalls_times_out() -> None:
    receiver = StreamReceiver()
    await receiver.start()

    class Stalling(PacedOutputs):
        async def outputs(self, args: GenerateArgs) -> AsyncIterator[dict[str, Any]]:
            yield _output(args, 0, 0, 1, 1, False, 10)
            yield _output(args, 0, 1, 1, 2, False, 10)
            await asyncio.sleep(30)

    replicas = ChannelReplicas(Stalling(random.Random(0)))
    runner = _runner(replicas, receiver, token_s=0.3)
    got: list[dict] = []
    with pytest.raises(ServiceUnavailable) as caught:
        await _read(runner, _job(runner, 5, 10), "pushed", got)
    assert caught.value.code == "replica_timeout" and _tokens(got) == [0, 1]
    [record] = runner.recorder.records()
    assert record.outcome == "timeout" and record.output_tokens == 2
    assert receiver.open_streams == 0 and runner.dispatcher.in_flight == 0
    await replicas.channels.close()
    await receiver.stop()


async def test_a_replica_that_dies_mid_stream_ends_a_pushed_stream_after_its_outputs() -> None:
    receiver = StreamReceiver()
    await receiver.start()

    class Dying(PacedOutputs):
        async def outputs(self, args: GenerateArgs) -> AsyncIterator[dict[str, Any]]:
            for i in range(3):
                yield _output(args, 0, i, 1, i + 1, False, 10)
            await asyncio.sleep(0.05)  # written before the call fails
            raise RuntimeError("ActorDiedError")

    replicas = ChannelReplicas(Dying(random.Random(0)))
    runner = _runner(replicas, receiver)
    got: list[dict] = []
    with pytest.raises(ReplicaFailure):
        await _read(runner, _job(runner, 6, 10), "pushed", got)
    assert _tokens(got) == [0, 1, 2]
    [record] = runner.recorder.records()
    assert record.outcome == "error" and record.output_tokens == 3
    await replicas.channels.close()
    await receiver.stop()
