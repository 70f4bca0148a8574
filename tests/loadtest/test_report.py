"""Run folder → summary, figures, self-contained HTML, terminal tables; two runs compared; the CLI."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fairlane.cli import app
from loadtest.records import read_records

SCENARIO = {
    "name": "tiny",
    "duration_s": 1.5,
    "warmup_s": 0.25,
    "request_timeout_s": 2.0,
    "drain_timeout_s": 2.0,
    "tenants": [
        {
            "id": "quiet",
            "api_key": "ok",
            "sla_class": "interactive",
            "weight": 2.0,
            "rate": 4.0,
            "output": {"kind": "fixed", "tokens": 4},
        },
        {
            "id": "noisy",
            "api_key": "ok",
            "sla_class": "batch",
            "concurrency": 2,
            "prompt": {"kind": "uniform", "min": 5, "max": 9},
            "output": {"kind": "uniform", "min": 3, "max": 6},
        },
        {"id": "limited", "api_key": "reject", "sla_class": "standard", "rate": 2.0},
    ],
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(fake, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of the same scenario through the CLI (different seeds), against the fake server."""
    url, _ = fake
    root = tmp_path_factory.mktemp("lt-runs")
    scenario = root / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    for name, seed in (("a", "1"), ("b", "2")):
        result = CliRunner().invoke(
            app, ["loadtest", str(scenario), "--url", url, "--out", str(root / name), "--seed", seed]
        )
        assert result.exit_code == 0, result.output
        assert "tiny" in result.output and "max service gap" in result.output
    return root / "a", root / "b"


def test_loadtest_writes_records_and_a_consistent_summary(runs: tuple[Path, Path]) -> None:
    run = runs[0]
    records = read_records(run / "records.jsonl")
    summary = json.loads((run / "summary.json").read_text())
    measured = [r for r in records if not r.warmup]
    assert summary["requests_total"] == len(records)
    assert summary["requests_measured"] == len(measured) > 0
    assert summary["tenants"]["limited"]["rejected"] == sum(1 for r in measured if r.tenant == "limited")
    assert summary["tenants"]["limited"]["errors"] == {
        "429:rate_limit_exceeded": summary["tenants"]["limited"]["rejected"]
    }
    assert summary["tenants"]["quiet"]["ok"] == sum(1 for r in measured if r.tenant == "quiet" and r.ok)
    assert summary["tenants"]["quiet"]["weight"] == 2.0
    assert summary["cost"]["replica_seconds"] > 0  # fake /health: 2 replicas
    ok_all = sum(1 for r in records if r.ok)
    assert summary["cost"]["dollars_per_success"] == pytest.approx(summary["cost"]["dollars"] / ok_all)
    assert set(summary["fairness"]["service"]) == {"quiet", "noisy", "limited"}
    # the load generator says whether its own loop kept up (a saturated client inflates latencies)
    assert summary["meta"]["client_loop_lag_ms"]["probes"] > 0


def test_report_renders_figures_html_and_table(runs: tuple[Path, Path]) -> None:
    run = runs[0]
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert "TTFT p50/p90/p99" in result.output and "quiet" in result.output
    names = {p.name for p in (run / "figures").glob("*.png")}
    assert names == {
        "ttft_cdf.png",
        "tpot_cdf.png",
        "service_share.png",
        "sla_attainment.png",
        "throughput.png",
        "rejections.png",
    }
    page = (run / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 6
    assert all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)
    assert "http://" not in page.split("<body>")[0]  # nothing fetched from elsewhere


def test_compare_puts_two_runs_side_by_side(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    out = tmp_path / "cmp"
    result = CliRunner().invoke(app, ["report", "--compare", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "a vs b" in result.output
    data = json.loads((out / "compare.json").read_text())
    assert data["labels"] == ["a", "b"]
    measures = [row[0] for row in data["rows"]]
    assert "quiet: TTFT p99 ms" in measures and "Jain, whole run" in measures
    assert "noisy" not in data["quiet_ttft_p99_ratio_b_over_a"]  # the busiest tenant is the noisy one
    assert (out / "ttft_cdf_compare.png").read_bytes().startswith(PNG_MAGIC)
    assert len(re.findall(r"data:image/png;base64,", (out / "report.html").read_text())) == 13


def test_report_of_a_folder_without_a_run_fails_clearly(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code != 0
    assert "summary.json" in str(result.exception)
