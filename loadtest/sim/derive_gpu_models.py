"""Derive H200 step-time models from the GPU engine benchmarks (``python -m bench.engine_lockstep`` JSONs).

    python -m loadtest.sim.derive_gpu_models /work/.device/4

Those runs hold one batch size each (32 sequences; the SmolLM2 shape also at 256), so not all four
coefficients are identifiable from them. What each coefficient is taken from:

* ``a`` — the async-mode decode step period at batch 32 (``tpot_ms_p50``) minus the ``b`` and ``d``
  terms at that batch and its mean context (prompt + half the output per sequence).
* ``b`` — per-sequence cost from the SmolLM2 runs at 32 and 256 sequences (compute p50 difference
  net of the context term), used for every model (the only pair of batch sizes measured).
* ``c`` — prefill: (mean − p50 compute) × steps / prompt tokens of the run: the prefill steps' excess.
* ``d`` — roofline: KV-cache bytes per context token / the measured copy bandwidth of the run.

A copy of the figures used is written to ``data/h200_bench_summary.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from loadtest.sim.step_model import DATA_DIR

RUNS = {"llama-3.1-8b": "b_8b.json", "llama-3.2-1b": "b_1b.json", "smollm2-135m": "b_smol.json"}
# (layers, kv heads, head dim) from replica/presets.py SHAPES; bf16 K and V.
KV_SHAPES = {"llama-3.1-8b": (32, 8, 128), "llama-3.2-1b": (16, 8, 64), "smollm2-135m": (30, 3, 64)}


def kv_bytes_per_token(model: str) -> int:
    layers, heads, dim = KV_SHAPES[model]
    return 2 * layers * heads * dim * 2


def _figures(run: dict) -> dict:
    r = run["results"]["async"]
    p = r["profile"]
    return {
        "date": run["date"],
        "cuda": run["cuda"],
        "args": run["args"],
        "tpot_ms_p50": r["tpot_ms_p50"],
        "ttft_ms_p50": r["ttft_ms_p50"],
        "output_tokens_per_s": r["output_tokens_per_s"],
        "steps": p["steps"],
        "compute_ms": p["compute_ms"],
        "mean_batch_size": p["mean_batch_size"],
        "copy_bandwidth_gbps": r.get("roofline", {}).get("copy_bandwidth_gbps"),
    }


def derive(src: Path) -> dict[str, dict]:
    figs = {m: _figures(json.loads((src / f).read_text())) for m, f in RUNS.items()}
    smol256 = _figures(json.loads((src / "b_smol256.json").read_text()))
    figs["smollm2-135m@256"] = smol256
    bw = figs["llama-3.1-8b"]["copy_bandwidth_gbps"] * 1e9
    d_of = {m: kv_bytes_per_token(m) / bw * 1e3 for m in RUNS}
    ctx32 = _mean_context(figs["smollm2-135m"]["args"]) * 32
    ctx256 = _mean_context(smol256["args"]) * 256
    dc = smol256["compute_ms"]["p50"] - figs["smollm2-135m"]["compute_ms"]["p50"]
    b = max(0.0, (dc - d_of["smollm2-135m"] * (ctx256 - ctx32)) / (256 - 32))
    models = {}
    for model in RUNS:
        f, args = figs[model], figs[model]["args"]
        ctx = _mean_context(args) * 32
        prefill = args["concurrency"] * args["prompt_len"]
        c = (f["compute_ms"]["mean"] - f["compute_ms"]["p50"]) * f["steps"] / prefill
        a = f["tpot_ms_p50"] - b * 32 - d_of[model] * ctx
        models[model] = {
            "name": f"h200-{model}",
            "a_ms": a,
            "b_ms_per_seq": b,
            "c_ms_per_prefill_token": c,
            "d_ms_per_context_token": d_of[model],
            "provenance": {
                "source": f"/work/.device/4/{RUNS[model]} (+ b_smol256.json for b); "
                "loadtest/sim/derive_gpu_models.py (module docstring: which figure gives which term)",
                "date": f["date"],
                "device": f["cuda"],
                "kv_bytes_per_token": kv_bytes_per_token(model),
                "copy_bandwidth_gbps": bw / 1e9,
                "decode_context_tokens_at_b32": ctx,
            },
        }
    return {"models": models, "figures": figs}


def _mean_context(args: dict) -> float:
    return args["prompt_len"] + args["max_tokens"] / 2


def main(argv: list[str] | None = None) -> None:
    src = Path((argv or sys.argv[1:] or ["/work/.device/4"])[0])
    out = derive(src)
    (DATA_DIR / "h200_bench_summary.json").write_text(json.dumps(out["figures"], indent=1) + "\n")
    for model, data in out["models"].items():
        (DATA_DIR / f"step_h200-{model}.json").write_text(json.dumps(data, indent=1) + "\n")
        print(model, {k: round(v, 6) for k, v in data.items() if k.endswith(("ms", "seq", "token"))})


if __name__ == "__main__":
    main()
