"""Fidelity: the same requests on the local cluster and in the simulator, side by side.

    python -m loadtest.sim.fidelity runs/fid-cluster --config loadtest/configs/cpu-fair.yaml \
        --step-model loadtest/sim/data/step_cpu-smollm2-cluster.json --out runs/fid-sim

The simulator is configured like the cluster's app config (one replica per ``num_replicas``, its
``replica_room``, engine ``max_num_seqs`` / ``max_num_batched_tokens`` / KV cache, queue timeout,
tenancy config with quotas) and replays the run's served requests (``loadtest.sim.replay``).
Both sides are measured with the load generator's definitions on the same requests (warm-up
left out): output tokens / s and requests / s over first send → last end, TTFT p50.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from loadtest.metrics import measured_window, ttft
from loadtest.records import RECORDS_FILE, RequestRecord, read_records, record_from_dict, write_records
from loadtest.sim.output import records as sim_records
from loadtest.sim.overheads import Overheads, measure
from loadtest.sim.record_profile import read_jsonl
from loadtest.sim.replay import Replay, replay_trace
from loadtest.sim.simulation import simulate
from loadtest.sim.spec import ClusterSpec, PolicySpec
from loadtest.sim.step_model import StepModel, load_step_model
from replica.device_choice import pick_device, resolve_mode
from replica.engine_sizes import CPU_BATCHED_TOKENS, CPU_MAX_SEQS, CUDA_BATCHED_TOKENS, CUDA_MAX_SEQS
from tenancy import TenancyConfig, default_tenancy_config, load_tenancy_config

# What the cluster runs: quotas, the tiered fair queue, reserved room, Serve's replica ranking.
CLUSTER_POLICY = PolicySpec(name="cluster", quotas=True, dispatch="fairlane")
TOLERANCE = 0.15
STEPS_FILE = "steps.jsonl"  # loadtest.sim.cluster_profile writes it into the run folder


def cluster_spec(app: dict, step_model: str, overheads: Overheads | None = None) -> ClusterSpec:
    """The simulator's cluster from an app config mapping (``cluster.config.AppConfig`` keys)."""
    engine = app.get("engine", {})
    block = engine.get("block_size", 16)
    slots, step_tokens = engine_slots(engine)
    return ClusterSpec(
        replicas=app.get("num_replicas", 1),
        step_model=step_model,
        kv_blocks=engine.get("kv_cache_tokens", 16384) // block,
        block_size=block,
        max_num_seqs=slots,
        max_num_batched_tokens=step_tokens,
        replica_room=app.get("replica_room") or slots,  # unset: the room follows the engine's slots
        queue_timeout_s=app.get("queue_timeout_s", 60.0),
        join_lag_steps=1 if engine_mode(engine) == "async" else 0,
        dispatch_latency_s=overheads.dispatch_s if overheads else 0.0,
        client_latency_s=overheads.client_s if overheads else 0.0,
    )


def engine_slots(engine: dict) -> tuple[int, int]:
    """The cluster engine's slots and step tokens: as set, or as the engine chooses them on its device
    (``replica/engine_sizes.py``; on CUDA the KV pool is not known here, so it is taken as ample)."""
    on_cuda = pick_device(engine.get("device", "auto")).type == "cuda"
    slots = engine.get("max_num_seqs") or (CUDA_MAX_SEQS if on_cuda else CPU_MAX_SEQS)
    tokens = engine.get("max_num_batched_tokens") or (CUDA_BATCHED_TOKENS if on_cuda else CPU_BATCHED_TOKENS)
    return slots, tokens


def engine_mode(engine: dict) -> str:
    """The loop mode the cluster's engine ran, resolved as the engine resolves "auto" (sync on the CPU)."""
    return resolve_mode(engine.get("mode", "auto"), pick_device(engine.get("device", "auto")))


def tenancy_of(app: dict) -> TenancyConfig:
    path = app.get("tenancy_config")
    return default_tenancy_config() if path is None else load_tenancy_config(path)


def simulate_replay(replay: Replay, tenancy: TenancyConfig, cluster: ClusterSpec, step: StepModel):
    """The replayed requests through the simulator; records carry the source's warm-up flag."""
    run = simulate(replay.trace, tenancy, CLUSTER_POLICY, cluster, step)
    out = sim_records(replay.trace, run)
    for rec, src in zip(out, replay.source, strict=True):
        rec.warmup, rec.request_id = src.warmup, src.request_id
    return out


def figures(records: Sequence[RequestRecord]) -> dict[str, dict[str, float | None]]:
    """Per tenant and overall: output tokens / s, requests / s, TTFT p50 (s); warm-up left out."""
    measured = [r for r in records if not r.warmup and r.ok]
    span = measured_window(measured) or float("nan")
    groups = {"overall": measured} | {t: [r for r in measured if r.tenant == t] for t in _tenants(measured)}
    return {name: _group(rs, span) for name, rs in groups.items()}


def _tenants(records: Sequence[RequestRecord]) -> list[str]:
    return sorted({r.tenant for r in records})


def _group(records: Sequence[RequestRecord], span: float) -> dict[str, float | None]:
    ttfts = [v for r in records if (v := ttft(r)) is not None]
    return {
        "requests": len(records),
        "output_tokens_per_s": sum(r.output_tokens for r in records) / span,
        "requests_per_s": len(records) / span,
        "ttft_p50_s": float(np.percentile(ttfts, 50)) if ttfts else None,
    }


def compare(real: dict, sim: dict) -> dict[str, dict[str, float | None]]:
    """(sim − real) / real for each figure of each group."""
    keys = ("output_tokens_per_s", "requests_per_s", "ttft_p50_s")
    return {g: {k: _rel(sim[g][k], real[g][k]) for k in keys} for g in real if g in sim}


def _rel(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


def evaluate(
    records: Sequence[RequestRecord],
    app: dict,
    tenancy: TenancyConfig,
    step_model: str,
    overheads: Overheads | None,
) -> tuple[dict, list[RequestRecord]]:
    """Replay ``records`` in the simulator configured as ``app``: (report, simulated records)."""
    replay = replay_trace(records, tenancy)
    step = load_step_model(step_model)
    sim = simulate_replay(replay, tenancy, cluster_spec(app, step_model, overheads), step)
    real_fig, sim_fig = figures(replay.source), figures(sim)
    diff = compare(real_fig, sim_fig)
    within = all(abs(v) <= TOLERANCE for g in diff.values() for v in g.values() if v is not None)
    report = {
        "step_model": step.as_dict() | {"name": step.name},
        "overheads": asdict(overheads) if overheads else None,
        "replayed": len(replay.trace),
        "dropped": replay.dropped,
        "cluster": real_fig,
        "simulator": sim_fig,
        "relative_difference": diff,
        "tolerance": TOLERANCE,
        "within_tolerance": within,
    }
    return report, sim


def measured_overheads(run_dir: Path, records: Sequence[RequestRecord]) -> Overheads:
    """From the run's router timings (``--admin-key``) and the replica's step records."""
    timings = json.loads((run_dir / "server_timings.json").read_text())["records"]
    return measure(records, timings, read_jsonl(run_dir / STEPS_FILE))


def run(
    run_dir: Path, app_config: Path, step_model: str, out: Path | None, no_overheads: bool = False
) -> dict:
    import yaml

    app = yaml.safe_load(app_config.read_text()) or {}
    records = read_records(run_dir / RECORDS_FILE)
    overheads = None if no_overheads else measured_overheads(run_dir, records)
    report, sim = evaluate(records, app, tenancy_of(app), step_model, overheads)
    report |= {"run": str(run_dir), "app_config": str(app_config)}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_records(out / RECORDS_FILE, sim)
        (out / "fidelity.json").write_text(json.dumps(report, indent=1))
    return report


FIXTURE_FIELDS = ("request_id", "tenant", "sla_class", "weight", "scheduled", "sent", "first_token", "end")
FIXTURE_FIELDS += ("prompt_tokens", "output_tokens", "max_tokens", "status", "warmup")


def write_fixture(path: Path, run_dir: Path, app: dict, step_model: str, report: dict) -> None:
    """The real run's served records (no token times) + the app config: the regression test's input."""
    recs = [r for r in read_records(run_dir / RECORDS_FILE) if r.ok]
    data = {
        "what": "served requests of a fairlane loadtest on the local CPU cluster (loadtest/sim/fidelity.py)",
        "run": str(run_dir),
        "app": app,
        "step_model": step_model,
        "figures": {"cluster": report["cluster"], "simulator": report["simulator"]},
        "overheads": report["overheads"],
        "records": [{k: getattr(r, k) for k in FIXTURE_FIELDS} for r in recs],
    }
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")


def read_fixture(path: Path) -> tuple[dict, list[RequestRecord], Overheads | None]:
    """(app config mapping, records, measured overheads) of a fixture written by ``write_fixture``."""
    data = json.loads(path.read_text())
    o = data.get("overheads")
    return data["app"], [record_from_dict(r) for r in data["records"]], Overheads(**o) if o else None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a fairlane loadtest output folder (records.jsonl)")
    p.add_argument("--config", type=Path, required=True, help="the app config the cluster ran with")
    p.add_argument("--step-model", required=True, help="step model name or JSON path")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--no-overheads", action="store_true", help="engine steps only (no measured latencies)")
    p.add_argument("--fixture", type=Path, default=None, help="also write the test fixture (JSON) here")
    args = p.parse_args(argv)
    report = run(args.run_dir, args.config, args.step_model, args.out, args.no_overheads)
    if args.fixture is not None:
        import yaml

        app = yaml.safe_load(args.config.read_text()) or {}
        write_fixture(args.fixture, args.run_dir, app, args.step_model, report)
    for group, real in report["cluster"].items():
        sim, d = report["simulator"][group], report["relative_difference"][group]
        print(
            f"{group:8s} tok/s cluster {real['output_tokens_per_s']:.2f} sim {sim['output_tokens_per_s']:.2f}"
            f" ({_pct(d['output_tokens_per_s'])})  TTFT p50 cluster {_s(real['ttft_p50_s'])}"
            f" sim {_s(sim['ttft_p50_s'])} ({_pct(d['ttft_p50_s'])})"
        )
    print(f"within ±{TOLERANCE:.0%}: {report['within_tolerance']}")
    return report


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}s"


if __name__ == "__main__":
    main()
