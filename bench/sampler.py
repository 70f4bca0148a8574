"""Device time of the sampler's parts, alone: penalties, the draw under each filter, logprobs.

    python -m bench.sampler --json out.json

Rows of random logits (scaled so the tempered distribution is peaked or flat) at the batch sizes
and vocabularies of the engine benchmarks; each part timed with CUDA events over a graph of 20
replays (median of 5). The draw's cost grows with the chain's links: a flat row with a small top-k
takes several, a top-p row on a peaked one usually one.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from replica.penalty_state import PenaltyState
from replica.sampler import SamplingTensors
from replica.triton_sampler import sample_rows

PROFILES = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.8),
    "top_p_0.9": dict(temperature=0.8, top_p=0.9),
    "top_k_50": dict(temperature=0.8, top_k=50),
    "min_p_0.05": dict(temperature=0.8, min_p=0.05),
    "all": dict(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05),
}


def params_for(rows: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> SamplingTensors:
    def full(value):
        return torch.full((rows,), value, device="cuda")

    return SamplingTensors(
        temperature=full(temperature), top_k=full(top_k), top_p=full(top_p), min_p=full(min_p),
        seed=torch.arange(rows, device="cuda"), position=full(7),
    )  # fmt: skip


def time_graph(fn, replays: int = 20) -> float:
    """Median microseconds per call of `fn` captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(replays):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / replays)
    return statistics.median(times)


def measure(rows: int, vocab: int, scale: float) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    raw = (torch.randn(rows, vocab, device="cuda", generator=g) * scale).to(torch.bfloat16)
    logits = raw.float()
    state = PenaltyState(rows, vocab, "cuda")
    slots_off = torch.full((rows,), -1, device="cuda")
    slots_on = torch.arange(rows, device="cuda")
    ones = torch.ones(rows, device="cuda")
    zeros = torch.zeros(rows, device="cuda")
    out = {
        "penalties_off_us": time_graph(lambda: state.process(raw, slots_off, ones, zeros, zeros)),
        "penalties_on_us": time_graph(
            lambda: state.process(raw, slots_on, ones * 1.1, ones * 0.2, ones * 0.1)
        ),
        "logprobs_top20_us": time_graph(
            lambda: (torch.logsumexp(raw.float(), -1), raw.float().topk(20, dim=-1))
        ),
    }
    for name, fields in PROFILES.items():
        params = params_for(rows, **fields)
        out[f"draw_{name}_us"] = time_graph(lambda params=params: sample_rows(logits, params))
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    report = {"cuda": torch.cuda.get_device_name(), "cases": {}}
    for vocab in (128256, 49152):
        for rows in (32, 256):
            for scale in (1.0, 4.0):  # flat and peaked rows
                key = f"v{vocab}_rows{rows}_scale{scale:g}"
                report["cases"][key] = measure(rows, vocab, scale)
                print(key, {k: round(v, 1) for k, v in report["cases"][key].items()}, flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
