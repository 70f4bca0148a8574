"""FP8's quality on the CPU: SmolLM2-135M's perplexity rise over float32 on the corpus paragraphs
(tests/replica/test_fp8.py's text and maths), every projection in FP8 and with layers kept in float32
(`fp8_skip_modules`), as the mean NLL of dithered runs.

One run's figure is chaotic in the activations' float rounding (tests/replica/test_fp8.py
DITHER_RUNS): each run scales the embedding by 1 + 1e-6·N(0, 1) with its own seed, and the JSON keeps
every run's rise beside the mean's. The CPU's vector kernels change the rounding too: compare
machines, or ``ATEN_CPU_CAPABILITY=avx2`` against the default, by the JSON's ``cpu_capability``.
``--dtype float64`` runs the rest of the model (norms, attention, residual stream) in float64 around
the FP8 products (still float32, replica/fp8_quant.py): the figure is then the same on every kernel.

    python -m bench.fp8_quality --runs 6 --out docs/bench/cpu_fp8_quality_dec07.json

``--smoke``: one run per setting (the test's check that the bench works).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from replica.embedded_model import ensure_converted
from replica.model_loader import build_model, read_config
from replica.weights import load_checkpoint
from tests.replica.test_fp8 import LAST_TWO_LAYERS, QUALITY_TEXT, dithered_perplexities

SETTINGS = {"every_projection": (), "last_two_layers_kept": LAST_TWO_LAYERS}


def measure(runs: int, dtype: torch.dtype = torch.float32) -> dict:
    model_dir = ensure_converted("smollm2-135m")
    ids = AutoTokenizer.from_pretrained(model_dir).encode(QUALITY_TEXT, add_special_tokens=False)
    config, _ = read_config(model_dir)
    start = time.perf_counter()
    base_model = build_model(config, torch.device("cpu"), dtype, None)
    load_checkpoint(base_model, model_dir)
    (base,) = dithered_perplexities(base_model.eval(), ids, 1)  # unquantised: the same in every run
    out: dict = {"tokens": len(ids), "runs": runs, "unquantised_perplexity": base, "settings": {}}
    for name, skip in SETTINGS.items():
        model = build_model(config, torch.device("cpu"), dtype, "fp8", skip)
        load_checkpoint(model, model_dir)
        each = dithered_perplexities(model.eval(), ids, runs)
        mean = math.exp(sum(math.log(p) for p in each) / runs)
        out["settings"][name] = {
            "fp8_skip_modules": list(skip),
            "rise_of_mean": mean / base - 1,
            "rise_each_run": [p / base - 1 for p in each],
        }
    out["seconds"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="dithered runs per setting")
    parser.add_argument("--smoke", action="store_true", help="one run per setting")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="model dtype")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 1
    result = {
        "what": "SmolLM2-135M perplexity rise over float32 with FP8 projections, CPU reference maths",
        "command": f"python -m bench.fp8_quality --runs {args.runs} --dtype {args.dtype}",
        "dtype": args.dtype,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    } | measure(args.runs, getattr(torch, args.dtype))
    for name, figures in result["settings"].items():
        each = ", ".join(f"{r:+.2%}" for r in figures["rise_each_run"])
        print(f"{name:22s} mean {figures['rise_of_mean']:+.2%}   runs {each}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
