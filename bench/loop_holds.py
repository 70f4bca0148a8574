"""How long one request's work holds the router's event loop (issue 22: at most 1 ms per callback).

    python -m bench.loop_holds --json docs/bench/cpu_loop_holds.json [--repeat 5]

Starts ``fairlane serve`` on the embedded default (the real SmolLM2 tokenizer and chat template),
then sends each kind of request one at a time, ``--repeat`` times, with the real ``openai`` client:
nothing else runs on the router, so each callback's time is one request's own work. After each
kind it reads ``/admin/state``'s ``loop_holds`` (``cluster/telemetry/loop_holds.py``: every
callback of the router's loop timed in this thread's CPU time and in wall time) and resets it.
Reported per kind: the longest hold (CPU and wall), how many callbacks exceeded 1 ms of CPU, and
the longest ones by the coroutine that ran.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from openai import OpenAI

from loadtest.serve_process import ServeProcess, free_port
from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS

MODEL = "smollm2-135m"
ADMIN = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "its",
    "form",
]


def text(chars: int, seed: int = 0) -> str:
    words, size, i = [], 0, seed
    while size < chars:
        word = WORDS[i % len(WORDS)]
        words.append(word)
        size += len(word) + 1
        i += 7
    return " ".join(words)[:chars]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": text(200, i),
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
    for i in range(5)
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "age"],
}


def kinds(client: OpenAI, repeat: int) -> dict[str, Callable[[int], object]]:
    chat = client.chat.completions.create
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": text(80, i)} for i in range(40)]
    return {
        "chat, short": lambda i: chat(
            model=MODEL, messages=[{"role": "user", "content": f"Hi {i}"}], max_tokens=8
        ),
        "chat, 3,500-char system prompt": lambda i: chat(
            model=MODEL,
            messages=[{"role": "system", "content": text(3500, i)}, {"role": "user", "content": "Go"}],
            max_tokens=8,
        ),
        "chat, 40 messages": lambda i: chat(
            model=MODEL, messages=[*history, {"role": "user", "content": str(i)}], max_tokens=8
        ),
        "chat, streamed 64 tokens": lambda i: list(
            chat(model=MODEL, messages=[{"role": "user", "content": f"Tell {i}"}], max_tokens=64, stream=True)
        ),
        "completions, 3,900-char prompt": lambda i: client.completions.create(
            model=MODEL, prompt=text(3900, i), max_tokens=8
        ),
        "chat, 5 tools": lambda i: chat(
            model=MODEL, messages=[{"role": "user", "content": f"Weather {i}?"}], tools=TOOLS, max_tokens=16
        ),
        "chat, json_schema": lambda i: chat(
            model=MODEL,
            messages=[{"role": "user", "content": f"Person {i}"}],
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
            max_tokens=24,
        ),
        "chat, n=4 with top-5 logprobs": lambda i: chat(
            model=MODEL,
            messages=[{"role": "user", "content": f"Say {i}"}],
            max_tokens=16,
            n=4,
            logprobs=True,
            top_logprobs=5,
        ),
    }


def measure(url: str, repeat: int) -> dict[str, dict]:
    client = OpenAI(base_url=f"{url}/v1", api_key=DEMO_KEYS["alice"], timeout=300, max_retries=0)
    results = {}
    for name, send in kinds(client, repeat).items():
        send(-1)  # a first call may build caches (a schema's grammar): measured like the others
        httpx.post(f"{url}/admin/timings/reset", headers=ADMIN, timeout=30)
        for i in range(repeat):
            send(i)
        holds = httpx.get(f"{url}/admin/state", headers=ADMIN, timeout=30).json()["loop_holds"]
        results[name] = holds
        top = holds["longest"][0]["name"] if holds["longest"] else "-"
        print(
            f"{name:34s} max cpu {holds['max_cpu_ms']:7.2f} ms, wall {holds['max_wall_ms']:7.2f} ms; "
            f"over 1 ms: {holds['over_bound']:3d} of {holds['steps']} steps; longest: {top}",
            flush=True,
        )
    return results


REQUEST_TASK = "UserCallableWrapper._call_http_entrypoint"  # Serve's task for each HTTP request


def summarize(results: dict[str, dict]) -> dict:
    """The longest step over all kinds: of the requests' own tasks, and of the router's other tasks
    (the ledger writer, the replica monitor), which hold the loop for every request alike."""
    holds = [h for kind in results.values() for h in kind["longest"]]
    own = [h["cpu_ms"] for h in holds if h["name"].startswith(REQUEST_TASK)]
    other = [h["cpu_ms"] for h in holds if not h["name"].startswith(REQUEST_TASK)]
    request_max = max(own, default=0.0)
    return {
        "max_cpu_ms": max(kind["max_cpu_ms"] for kind in results.values()),
        "request_path_max_cpu_ms": request_max,
        "background_max_cpu_ms": max(other, default=0.0),
        "request_path_1ms_met": request_max <= 1.0,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fl-holds-") as tmp:
        config = Path(tmp) / "app.yaml"
        config.write_text("num_replicas: 1\nloop_holds: true\n")
        serve = ServeProcess(config, free_port(), Path(tmp))
        serve.start()
        try:
            serve.wait_ready(600)
            t0 = time.monotonic()
            results = measure(serve.url, args.repeat)
            wall = time.monotonic() - t0
        finally:
            serve.stop()
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.node(),
        "command": "python -m bench.loop_holds " + " ".join(argv or []),
        "repeat": args.repeat,
        "wall_s": wall,
        "kinds": results,
        **summarize(results),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
