"""Where a run's device idle falls, from every step's profiler record (bench/engine_trace.py's
``--step-records``): per run, the idle before steps of each sort (split or not, read back early
or not, with a prompt chunk or not), the loop's own waits, and the longest gaps with what the host
did around them.

    python -m bench.step_gaps step_records.json [--top 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

HOST = ("postprocess_ms", "schedule_ms", "prepare_ms", "launch_ms", "wait_ms", "idle_ms")


def sort_of(record: dict) -> str:
    split = "split" if record.get("masked_rows") else "plain"
    early = "+early" if record.get("read_early") else ""
    chunk = "+prompt" if record["num_prefill_tokens"] else ""
    return f"{record['kind']}:{split}{early}{chunk}"


def breakdown(records: list[dict]) -> dict:
    """Idle and compute totals (ms) by the sort of the step the idle came before."""
    sorts: dict[str, dict[str, float]] = {}
    for r in records[1:]:
        s = sorts.setdefault(sort_of(r), {"steps": 0, "gap_ms": 0.0, "idle_ms": 0.0, "compute_ms": 0.0})
        s["steps"] += 1
        s["gap_ms"] += r["gap_ms"]
        s["idle_ms"] += r["idle_ms"]
        s["compute_ms"] += r["compute_ms"]
    return sorts


def longest(records: list[dict], top: int) -> list[dict]:
    """The ``top`` longest gaps: the step's own fields and the host fields of the step before it."""
    rows = []
    for prev, r in itertools.pairwise(records):
        rows.append({
            "step": r["step_id"], "gap_ms": r["gap_ms"], "sort": sort_of(r), "rows": r["batch_size"],
            "prefill": r["num_prefill_tokens"], "masked": r.get("masked_rows", 0),
            **{f"this_{k}": r[k] for k in HOST}, **{f"prev_{k}": prev[k] for k in HOST},
        })  # fmt: skip
    return sorted(rows, key=lambda row: -row["gap_ms"])[:top]


def report(runs: dict[str, list[dict]], top: int) -> dict:
    out = {}
    for name, records in runs.items():
        compute = sum(r["compute_ms"] for r in records[1:])
        gap = sum(r["gap_ms"] for r in records[1:])
        out[name] = {
            "steps": len(records), "compute_ms": compute, "gap_ms": gap,
            "idle_ms": sum(r["idle_ms"] for r in records[1:]),
            "busy": compute / max(1e-9, compute + gap),
            "by_sort": breakdown(records), "longest": longest(records, top),
        }  # fmt: skip
    return out


def print_report(rep: dict) -> None:
    for name, r in rep.items():
        print(f"== {name}: {r['steps']} steps, busy {r['busy']:.3f}, gap {r['gap_ms']:.0f} ms, "
              f"loop idle {r['idle_ms']:.0f} ms")  # fmt: skip
        for sort, s in sorted(r["by_sort"].items(), key=lambda kv: -kv[1]["gap_ms"]):
            print(f"   {sort:<34} {s['steps']:5d} steps  gap {s['gap_ms']:8.1f}  idle {s['idle_ms']:8.1f}"
                  f"  compute {s['compute_ms']:9.1f}")  # fmt: skip
        for row in r["longest"]:
            host = " ".join(f"{k[5:-3]}={row[k]:.1f}" for k in row if k.startswith("prev_"))
            mine = " ".join(f"{k[5:-3]}={row[k]:.1f}" for k in row if k.startswith("this_"))
            where = f"{row['sort']} rows={row['rows']} masked={row['masked']}"
            print(f"   gap {row['gap_ms']:6.1f} before {where} | prev: {host} | this: {mine}")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", type=Path)
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    rep = report(json.loads(args.records.read_text()), args.top)
    print_report(rep)
    if args.json:
        args.json.write_text(json.dumps(rep, indent=2))
    return rep


if __name__ == "__main__":
    main()
