"""Write a simulated run in the load generator's folder format, so ``fairlane report`` reads it.

Per policy, ``OUT/<policy>/`` holds ``records.jsonl`` (``loadtest.records.RequestRecord``, times in
seconds from the trace start, ``server_id`` = replica) and, up to ``LOADGEN_SUMMARY_MAX`` requests,
the load generator's own ``summary.json`` (``loadtest.summary.summarize``; it is O(tenants ×
records), see NEEDS.md item 4); always ``sim_summary.json`` (``loadtest.sim.summary``). ``OUT``
gets ``comparison.json`` with every policy's sim summary and the run's settings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from loadtest.records import RECORDS_FILE, RequestRecord, write_records
from loadtest.scenario import Scenario
from loadtest.sim.outcomes import HTTP_STATUS, OK, QUEUE_TIMEOUT, STATUS_NAMES, UNFINISHED
from loadtest.sim.simulation import RunResult
from loadtest.sim.workload import Trace

LOADGEN_SUMMARY_MAX = 50_000
SIM_SUMMARY_FILE = "sim_summary.json"


def records(trace: Trace, run: RunResult) -> list[RequestRecord]:
    o, out = run.outcomes, []
    arrival, first, end = trace.arrival.tolist(), o.first_token.tolist(), o.end.tolist()
    for i in range(len(trace)):
        t = trace.tenants[trace.tenant[i]]
        status = int(o.status[i])
        ok = status == OK
        out.append(
            RequestRecord(
                request_id=str(i),
                tenant=t.id,
                sla_class=t.sla_class,
                weight=t.weight,
                scheduled=arrival[i],
                sent=arrival[i],
                first_token=first[i] if ok else None,
                end=_finite(end[i]),
                prompt_tokens=int(trace.prompt[i]),
                output_tokens=int(o.output[i]),
                max_tokens=int(trace.max_tokens[i]),
                status="ok" if ok else ("cancelled" if status == UNFINISHED else "http_error"),
                http_status=HTTP_STATUS[status] or None,
                error=None if ok else _error(status, o.reason.get(i)),
                server_id=f"sim-replica-{o.replica[i]}" if ok else None,
            )
        )
    return out


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


def _error(status: int, reason: str | None) -> str:
    name = STATUS_NAMES[status]
    if status == QUEUE_TIMEOUT:
        return "queue_timeout"
    return f"{name}:{reason}" if reason else name


def write_policy(
    out: Path, scenario: Scenario, trace: Trace, run: RunResult, summary: dict, write_records_file: bool
) -> Path:
    from loadtest.summary import summarize as loadgen_summarize

    folder = out / run.policy.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SIM_SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=_json_default))
    (folder / "scenario.json").write_text(scenario.model_dump_json(indent=1))
    if write_records_file or len(trace) <= LOADGEN_SUMMARY_MAX:
        recs = records(trace, run)
        write_records(folder / RECORDS_FILE, recs)
        if len(trace) <= LOADGEN_SUMMARY_MAX:
            meta = {
                "scenario": scenario.name,
                "url": "simulator",
                "source": "loadtest.sim",
                "policy": run.policy.name,
                "duration_s": trace.duration_s,
                "warmup_s": 0.0,
                "elapsed_s": run.end_time,
                "started_unix": None,
                "replica_samples": [],
            }
            s = loadgen_summarize(
                recs,
                scenario.classes,
                meta,
                run.replica_seconds,
                summary["dollars"] / max(summary["gpu_hours"], 1e-12),
            )
            (folder / "summary.json").write_text(json.dumps(s, indent=1, default=_json_default))
    return folder


def _json_default(x):
    if isinstance(x, np.integer | np.floating):
        return x.item()
    raise TypeError(f"not JSON-able: {type(x).__name__}")
