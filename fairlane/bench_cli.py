"""`fairlane bench ...`: benchmarks, each writing JSON and printing a table last."""

from __future__ import annotations

from pathlib import Path

import typer

bench_app = typer.Typer(help="Benchmarks (JSON out, table printed last).", no_args_is_help=True)


@bench_app.command("engine")
def bench_engine(
    model: str = typer.Option("smollm2-135m", help="Preset name or local model directory."),
    random_weights: bool = typer.Option(
        False, "--random-weights", help="Random weights of the preset's shape."
    ),
    device: str = typer.Option("auto", help="cpu, cuda or auto."),
    concurrency: int = typer.Option(16, "--concurrency", "--batch", help="Requests in flight at once."),
    prompt_len: int = typer.Option(128, help="Prompt tokens per request."),
    max_tokens: int = typer.Option(128, help="Output tokens per request (EOS ignored)."),
    max_batched_tokens: int = typer.Option(2048, help="Token budget per engine step."),
    modes: str = typer.Option("async,sync,hf-single", help="Any of async, sync, hf, hf-single."),
    sampling: str = typer.Option("greedy", help="Lockstep profiles: any of greedy, sampled, logprobs."),
    hf_requests: int = typer.Option(4, help="Requests timed in hf-single mode."),
    workload: str = typer.Option(
        "lockstep",
        help="lockstep: equal requests all at once; trace: Poisson ladder, sampling mix vs greedy.",
    ),
    requests: int = typer.Option(600, help="trace: requests per run."),
    rates: str = typer.Option("10,20,40,inf", help="trace: requests per second, inf = all at once."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the full report here."),
) -> None:
    """Our engine: lockstep batches (async, sync, transformers side by side, under sampling profiles),
    or the realistic trace (bench/engine_trace.py: the sampling mix beside the same trace greedy)."""
    if workload == "trace":
        from bench import engine_trace

        argv = ["--model", model, "--device", device, "--requests", str(requests), "--rates", rates]
        argv += ["--max-batched-tokens", str(max_batched_tokens)]
        argv += ["--random-weights"] if random_weights else []
        argv += ["--json", str(json_out)] if json_out is not None else []
        engine_trace.main(argv)
        return
    if workload != "lockstep":
        raise typer.BadParameter("workload is lockstep or trace", param_hint="--workload")
    from bench import engine_lockstep as bench

    argv = [
        "--model", model, "--device", device, "--concurrency", str(concurrency),
        "--prompt-len", str(prompt_len), "--max-tokens", str(max_tokens),
        "--max-batched-tokens", str(max_batched_tokens), "--modes", modes,
        "--hf-requests", str(hf_requests), "--sampling", sampling,
    ]  # fmt: skip
    if random_weights:
        argv.append("--random-weights")
    if json_out is not None:
        argv += ["--json", str(json_out)]
    bench.main(argv)
