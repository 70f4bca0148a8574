"""What a busy replica's event loop spends per engine step to pass its outputs on to the routers.

A real ``ReplicaServer`` (its engine, its stream channel) serves ``--streams`` channel requests at
once; a plain TCP reader in a thread stands for the router and discards the frames. While every
stream decodes, the bench reads the event-loop thread's own CPU clock and the engine's step count:
their ratio is the loop's CPU per step, the time in which the replica takes in no new request.

    python -m bench.replica_delivery --streams 128 --json OUT.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from typing import Any

from cluster.serving.replica_deployment import ReplicaServer
from cluster.serving.wire import GenerateArgs


class FrameSink:
    """A router stand-in: accepts connections and reads them to the end, discarding the bytes."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.bytes_read = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self._listener.accept()
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn: socket.socket) -> None:
        while chunk := conn.recv(1 << 16):
            self.bytes_read += len(chunk)


def loop_thread_cpu_s() -> float:
    """CPU seconds of the calling thread (the event loop's), not of the engine's thread."""
    return time.clock_gettime(time.pthread_getcpuclockid(threading.get_ident()))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    engine = {
        "model": args.model,
        "device": args.device,
        "kv_cache_tokens": args.kv_cache_tokens,
        "max_num_seqs": args.streams,  # every stream decodes in every step
    }
    if args.random_weights:
        engine["random_weights"] = True
    server = ReplicaServer.__new__(ReplicaServer)
    await ReplicaServer.__init__(server, engine)
    sink = FrameSink()
    sampling = {"max_tokens": args.tokens, "ignore_eos": True, "temperature": 1.0, "top_p": 0.95}
    calls = [
        asyncio.ensure_future(
            server.generate_channel(
                GenerateArgs(f"d{i}", list(range(100 + i, 100 + i + args.prompt_tokens)), sampling,
                             reply_to=sink.address, channel_key="k", flush_s=args.flush_s)
            )
        )
        for i in range(args.streams)
    ]  # fmt: skip
    stats = server._engine.stats
    while stats().running < args.streams or stats().waiting:
        await asyncio.sleep(0.2)  # seldom: this loop's own wakes are counted too
    start_steps = stats().steps
    while stats().steps < start_steps + args.warmup_steps:
        await asyncio.sleep(0.2)  # seldom: this loop's own wakes are counted too
    cpu0, steps0, wall0 = loop_thread_cpu_s(), stats().steps, time.perf_counter()
    while stats().steps < steps0 + args.steps:
        await asyncio.sleep(0.2)  # seldom: this loop's own wakes are counted too
    cpu1, steps1, wall1 = loop_thread_cpu_s(), stats().steps, time.perf_counter()
    running = stats().running
    answers = await asyncio.gather(*calls)
    await server._channels.close()
    await server._engine.stop()
    steps = steps1 - steps0
    return {
        "streams": args.streams,
        "running_at_end_of_window": running,
        "steps": steps,
        "window_s": wall1 - wall0,
        "step_ms": (wall1 - wall0) / steps * 1000.0,
        "loop_cpu_ms_per_step": (cpu1 - cpu0) / steps * 1000.0,
        "loop_share_of_step": (cpu1 - cpu0) / (wall1 - wall0),
        "answers_ok": sum(1 for a in answers if a.get("ok")),
        "bytes_to_router": sink.bytes_read,
        "config": {k: v for k, v in vars(args).items() if k != "json"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=160, help="max_tokens of every stream")
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100, help="steps in the measured window")
    parser.add_argument("--flush-s", type=float, default=0.02)
    parser.add_argument("--kv-cache-tokens", type=int, default=32768)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
