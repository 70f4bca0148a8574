"""FP8 weights against bf16 in serving (issue 45's targets), from the JSON the runs of
bench/h200_fp8_serving_runs.sh leave in one folder:

    python -m bench.fp8_serving_table OUT_DIR      # writes OUT_DIR/fp8_serving.json, prints a table

- lockstep_{bf16,fp8}.json (bench/engine_lockstep.py, 32 sequences, 256-token prompts, 512 tokens
  each, greedy): output tok/s, target fp8 ÷ bf16 ≥ 1.5;
- trace_{bf16,fp8}.json (bench/engine_trace.py, the realistic sampled mix, Poisson at 20 req/s and
  all at once): throughput at saturation ("inf") ≥ 1.3×, TPOT p50 at 20 req/s ≤ 0.75×; TTFT, ITL and
  the rest beside them.
A file that is missing (a run cut off) leaves its rows out; the JSON says which.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TARGETS = {"lockstep_tok_s": 1.5, "trace_inf_tok_s": 1.3, "trace_20_tpot_p50": 0.75}
TRACE_FIELDS = (
    "output_tokens_per_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "itl_ms_p50",
    "itl_ms_p99",
)


def _read(folder: Path, name: str) -> dict | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def summarise(folder: Path) -> dict:
    """Each variant's figures and fp8 ÷ bf16 where both ran."""
    out: dict = {"figures": {}, "ratios": {}, "missing": []}
    for variant in ("bf16", "fp8"):
        lock, trace = _read(folder, f"lockstep_{variant}"), _read(folder, f"trace_{variant}")
        figures = {}
        if lock and "async" in lock.get("results", {}):
            figures["lockstep_tok_s"] = lock["results"]["async"]["output_tokens_per_s"]
        else:
            out["missing"].append(f"lockstep_{variant}")
        if trace:
            for key, r in trace["results"].items():
                figures |= {f"trace_{key}_{f}": r.get(f) for f in TRACE_FIELDS}
            figures["cuda"] = trace.get("cuda")
        else:
            out["missing"].append(f"trace_{variant}")
        out["figures"][variant] = figures
    bf16, fp8 = out["figures"]["bf16"], out["figures"]["fp8"]
    pairs = {
        "lockstep_tok_s": "lockstep_tok_s",
        "trace_inf_tok_s": "trace_mixed@inf_output_tokens_per_s",
        "trace_20_tok_s": "trace_mixed@20_output_tokens_per_s",
        "trace_20_tpot_p50": "trace_mixed@20_tpot_ms_p50",
        "trace_20_ttft_p99": "trace_mixed@20_ttft_ms_p99",
        "trace_20_itl_p99": "trace_mixed@20_itl_ms_p99",
        "trace_inf_tpot_p50": "trace_mixed@inf_tpot_ms_p50",
    }
    for name, field in pairs.items():
        if bf16.get(field) and fp8.get(field) is not None:
            out["ratios"][name] = fp8[field] / bf16[field]
    out["targets"] = {
        name: (out["ratios"][name] >= goal if name.endswith("tok_s") else out["ratios"][name] <= goal)
        for name, goal in TARGETS.items()
        if name in out["ratios"]
    }
    return out


def main() -> None:
    folder = Path(sys.argv[1])
    rep = summarise(folder)
    (folder / "fp8_serving.json").write_text(json.dumps(rep, indent=2))
    print(f"{'fp8 / bf16':<22}{'ratio':>8}  target")
    for name, ratio in rep["ratios"].items():
        goal = TARGETS.get(name)
        met = (
            ""
            if goal is None
            else f"{'>=' if name.endswith('tok_s') else '<='} {goal}: {rep['targets'][name]}"
        )
        print(f"{name:<22}{ratio:>8.3f}  {met}")
    if rep["missing"]:
        print("missing:", ", ".join(rep["missing"]))


if __name__ == "__main__":
    main()
