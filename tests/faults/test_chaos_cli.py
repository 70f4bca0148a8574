"""``fairlane chaos`` prints the accounting table and fails when the two sides disagree."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from cluster.ops.chaos_drills import DrillReport
from fairlane.chaos_cli import show
from fairlane.cli import app

COUNTS = {"sent": 3, "completed": 1, "rejected": 1, "errored": 0, "aborted": 1}


def test_show_passes_a_balanced_report_and_fails_an_unbalanced_one(capsys) -> None:
    show(DrillReport("storm", dict(COUNTS), dict(COUNTS), {"leases_after": 0}))
    assert "balanced" in capsys.readouterr().out
    with pytest.raises(typer.Exit):
        show(DrillReport("storm", dict(COUNTS), COUNTS | {"aborted": 0, "sent": 2}))


def test_chaos_is_a_fairlane_command() -> None:
    result = CliRunner().invoke(app, ["chaos", "--help"])
    assert result.exit_code == 0
    assert all(drill in result.output for drill in ("overload", "storm", "crash", "redis"))
