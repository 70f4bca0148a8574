"""The replica's channel relay with the real engine: each step's outputs go onto the router's stream
channel from the engine's delivery (no task per request). Every token arrives in order, exactly
once, with many streams multiplexed and several samples per request; a client that leaves, a router
that goes away and an engine that stops each end the request in the engine at once, and the call's
answer says what happened. The replica is a real ``ReplicaServer`` (SmolLM2 on the CPU) and the
router side a real ``StreamReceiver``; only the Serve call is a task (``FakeCall``)."""

from __future__ import annotations

import asyncio

import pytest

from cluster.routing.stream_receiver import StreamReceiver
from cluster.serving.replica_deployment import ReplicaServer
from cluster.serving.wire import GenerateArgs
from tests.cluster.routing.test_stream_channel import FakeCall

PROMPTS = [list(range(100 + 7 * i, 120 + 9 * i)) for i in range(8)]


@pytest.fixture(scope="module")
async def server():
    replica = ReplicaServer.__new__(ReplicaServer)
    await ReplicaServer.__init__(replica, {"model": "smollm2-135m", "device": "cpu", "kv_cache_tokens": 8192})
    yield replica
    await replica._channels.close()
    await replica._engine.stop()


@pytest.fixture
async def receiver():
    router = StreamReceiver()
    await router.start()
    yield router
    await router.stop()


def _args(receiver: StreamReceiver, request_id: str, prompt: list[int], **sampling) -> GenerateArgs:
    return GenerateArgs(
        request_id, prompt, sampling, reply_to=receiver.address, channel_key=receiver.key, flush_s=0.01
    )


async def _read_all(stream) -> list[dict]:
    items = [await stream.next(30.0)]
    while not items[-1].get("done") and "error" not in items[-1]:
        items.append(await stream.next(30.0))
    return items


async def _reference(server: ReplicaServer, prompt: list[int], max_tokens: int) -> list[int]:
    """The same greedy request through the Serve-stream path (a queue and generators)."""
    args = GenerateArgs("ref-" + str(prompt[0]), prompt, {"max_tokens": max_tokens, "temperature": 0.0})
    return [t async for item in server.generate(args) for t in item["token_ids"]]


async def test_many_streams_arrive_in_order_exactly_once(server, receiver) -> None:
    calls, streams = {}, {}
    for i, prompt in enumerate(PROMPTS):
        sampled = i % 2 == 1  # every other request samples two answers at temperature 1
        sampling = {"max_tokens": 12 + 3 * i, "ignore_eos": True, "temperature": 1.0 if sampled else 0.0}
        if sampled:
            sampling.update(n=2, seed=i)
        args = _args(receiver, f"mux-{i}", prompt, **sampling)
        calls[i] = FakeCall(server.generate_channel(args))
        streams[i] = receiver.open(args.request_id, calls[i])
    results = await asyncio.gather(*(_read_all(streams[i]) for i in range(len(PROMPTS))))
    for i, items in enumerate(results):
        assert await calls[i] == {"ok": True}
        max_tokens, samples = 12 + 3 * i, 2 if i % 2 else 1
        assert [item["done"] for item in items] == [False] * (len(items) - 1) + [True]
        per_sample: dict[int, list[int]] = {}
        for item in items:
            per_sample.setdefault(item["index"], []).extend(item["token_ids"])
            assert item["num_output_tokens"] == len(per_sample[item["index"]])  # nothing lost or twice
        assert sorted(per_sample) == list(range(samples))
        assert all(len(tokens) == max_tokens for tokens in per_sample.values())
        assert items[-1]["total_output_tokens"] == max_tokens * samples
        if samples == 1:  # greedy: the very tokens of the generator path, in order
            assert per_sample[0] == await _reference(server, PROMPTS[i], max_tokens)
    assert server._engine.open_streams == 0


async def test_a_client_that_leaves_aborts_the_engine_request(server, receiver) -> None:
    args = _args(receiver, "leaves", PROMPTS[0], max_tokens=2000, ignore_eos=True, temperature=0.0)
    call = FakeCall(server.generate_channel(args))
    stream = receiver.open(args.request_id, call)
    first = await stream.next(30.0)
    assert first["token_ids"] and not first["done"]
    stream.cancel()  # what the router does when its client disconnects
    with pytest.raises(asyncio.CancelledError):
        await call
    await _until(lambda: server._engine.open_streams == 0 and server._engine.stats().running == 0)


async def test_a_router_that_goes_away_ends_the_request_in_the_engine(server, receiver) -> None:
    args = _args(receiver, "orphan", PROMPTS[1], max_tokens=2000, ignore_eos=True, temperature=0.0)
    call = FakeCall(server.generate_channel(args))
    stream = receiver.open(args.request_id, call)
    await stream.next(30.0)
    await receiver.stop()  # the router stopped: nobody reads this request's tokens any more
    answer = await asyncio.wait_for(call, 60.0)
    assert answer["error"]["kind"] == "channel_error"
    assert server._engine.open_streams == 0
    await _until(lambda: server._engine.stats().running == 0)


async def test_an_engine_stop_ends_the_call_with_aborted_after_the_tokens_sent(receiver) -> None:
    replica = ReplicaServer.__new__(ReplicaServer)
    await ReplicaServer.__init__(replica, {"model": "smollm2-135m", "device": "cpu", "kv_cache_tokens": 2048})
    args = _args(receiver, "stopped", PROMPTS[2], max_tokens=400, ignore_eos=True, temperature=0.0)
    call = FakeCall(replica.generate_channel(args))
    stream = receiver.open(args.request_id, call)
    await stream.next(30.0)
    await replica._engine.stop()
    answer = await asyncio.wait_for(call, 30.0)
    assert answer["error"]["kind"] == "aborted"
    items = await _read_all(stream)  # the router ends the stream once the tokens before it are read
    assert items[-1]["error"]["kind"] == "aborted"
    assert answer["after_tokens"] < 400
    await replica._channels.close()


async def test_bad_sampling_is_answered_as_an_invalid_request(server, receiver) -> None:
    answer = await server.generate_channel(_args(receiver, "bad", PROMPTS[0], max_tokens=4, top_p=7.0))
    assert answer["error"]["kind"] == "invalid_request"
    answer = await server.generate_channel(_args(receiver, "bad2", PROMPTS[0], max_tokens=4, no_such_field=1))
    assert answer["error"]["kind"] == "invalid_request"
    assert server._engine.open_streams == 0


async def _until(predicate, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.02)
