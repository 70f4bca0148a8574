from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis

from tenancy.bench import main as bench_main


def main(argv: list[str]) -> dict[str, Any]:
    """Run the benchmark in a thread of its own: its asyncio.run must not touch pytest's loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(bench_main, argv).result()


def test_bench_writes_json_with_both_stores_and_cleans_redis(tmp_path: Path, redis_url: str) -> None:
    out = tmp_path / "bench.json"
    printed = main(
        [
            "--tenants",
            "30",
            "--requests",
            "600",
            "--redis-url",
            redis_url,
            "--concurrency",
            "8",
            "--json",
            str(out),
        ]
    )
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved == printed
    assert saved["tenants"] == 30
    for key in (
        "fair_queue_push_pop_per_s",
        "memory_decisions_per_s",
        "redis_decisions_per_s",
        "redis_decisions_per_s_concurrency_8",
    ):
        assert saved[key] > 0, key
    client = redis.Redis.from_url(redis_url)
    assert not list(client.scan_iter(match="bench-*"))
    client.close()


def test_bench_without_redis(tmp_path: Path) -> None:
    result = main(["--tenants", "5", "--requests", "200", "--redis-url", ""])
    assert result["redis_decisions_per_s"] is None and result["memory_decisions_per_s"] > 0
