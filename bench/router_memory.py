"""A router's resident memory on the embedded default, and whether torch is mapped into it.

Starts the local cluster (CPU, SmolLM2, the demo tenants), sends a chat and a completion so the
router has tokenized both kinds, then reads every Router actor's RSS and memory map from /proc.
Run it from a checkout's root: `python -m bench.router_memory --json out.json`; it runs on older
commits too (it finds the local cluster where each layout kept it), which is how the before/after
pair in BENCHMARKS.md was measured.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
from pathlib import Path

import httpx

from tenancy import DEMO_KEYS


def _import_first(*names: str):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(names)


def router_pids() -> list[int]:
    """Ray titles each actor process `ray::ServeReplica:<app>:<deployment>`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                title = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if title.startswith("ray::ServeReplica:") and ":Router" in title:
                pids.append(int(proc.name))
    return pids


def router_processes() -> list[dict]:
    rows = []
    for pid in router_pids():
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
        maps = Path(f"/proc/{pid}/maps").read_text()
        torch = "libtorch" in maps
        rows.append({"pid": pid, "rss_mb": round(rss_kb / 1024, 1), "libtorch_mapped": torch})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    local = _import_first("cluster.ops.local_cluster", "cluster.local_cluster")
    config = importlib.import_module("cluster.config").AppConfig(engine={"device": "cpu"})
    key = DEMO_KEYS["alice"]
    with local.local_cluster(config) as url:
        headers = {"Authorization": f"Bearer {key}"}
        chat = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        completion = {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 4}
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
            httpx.post(url + path, json=body, headers=headers, timeout=120).raise_for_status()
        routers = router_processes()
    git = ["git", "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    result = {"commit": commit, "routers": routers, "router_rss_mb": max(r["rss_mb"] for r in routers)}
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
