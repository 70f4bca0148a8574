"""A run's output folder: raw records (JSONL), run metadata, summary, server-side reports."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.records import RECORDS_FILE, RequestRecord, read_records, write_records
from loadtest.runner import RunResult
from loadtest.scenario import Scenario
from loadtest.summary import summarize

SUMMARY_FILE = "summary.json"
SCENARIO_FILE = "scenario.json"
SERVER_FILES = {"sla": "server_sla.json", "timings": "server_timings.json"}


def write_run(
    out: Path, scenario: Scenario, url: str, result: RunResult, window_s: float | None = None
) -> dict:
    """Write every file of the run and return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / RECORDS_FILE, result.records)
    (out / SCENARIO_FILE).write_text(scenario.model_dump_json(indent=1), encoding="utf-8")
    for key, name in SERVER_FILES.items():
        if key in result.server:
            (out / name).write_text(json.dumps(result.server[key], indent=1), encoding="utf-8")
    meta = {
        "scenario": scenario.name,
        "url": url,
        "started_unix": result.started_wall,
        "elapsed_s": result.elapsed_s,
        "duration_s": scenario.duration_s,
        "warmup_s": scenario.warmup_s,
        "replica_samples": result.replica_samples,
        "client_loop_lag_ms": result.client_loop_lag,  # the load generator's own loop: saturated?
        "router_loop_lag_ms": result.server.get("router_loop_lag"),  # since the run's timings reset
        "client_gc": result.client_gc,  # the load generator's collector pauses (ms) in the run
        "router_gc": result.server.get("router_gc"),  # the router's, since the run's timings reset
        "replica_gc": result.server.get("replica_gc"),  # each replica's, since it started
        # each replica's step profile as last polled (its last profile_history steps): holds, gaps
        "replica_profiles": result.server.get("replica_profiles"),
        "drain": result.drain,  # the drain after the load: its bound, its parts, how long it took
    }
    summary = summarize(
        result.records,
        scenario.classes,
        meta,
        result.replica_seconds,
        scenario.gpu_dollars_per_hour,
        window_s,
    )
    write_json(out / SUMMARY_FILE, summary)
    return summary


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def read_summary(run: Path) -> dict:
    path = run / SUMMARY_FILE
    if not path.exists():
        raise FileNotFoundError(f"{run}: no {SUMMARY_FILE} (not a loadtest output folder?)")
    return json.loads(path.read_text(encoding="utf-8"))


def read_run_records(run: Path) -> list[RequestRecord]:
    return read_records(run / RECORDS_FILE)


def read_server(run: Path, key: str) -> dict | None:
    path = run / SERVER_FILES[key]
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
