"""BENCHMARKS.md's ledger: every row's JSON is committed and holds the figure the row states."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["figure", "value", "date", "machine", "commit", "command", "json", "key"]


def ledger_rows() -> list[dict[str, str]]:
    """The rows of the first table in BENCHMARKS.md, by column name."""
    rows, started = [], False
    for line in (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "figure" or set(cells[0]) <= {"-"}:
            continue
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


def lookup(data: dict | list, dotted: str) -> float:
    """The value at a dotted path; a part that indexes a list is its position (`waits.0.s`)."""
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return float(data)


def stated(value: str) -> tuple[float, int]:
    """The row's number and its decimals: '5,782 tok/s' -> (5782.0, 0), '0.993×' -> (0.993, 3)."""
    match = re.search(r"[0-9][0-9,]*(?:\.[0-9]+)?", value)
    assert match, value
    text = match.group().replace(",", "")
    return float(text), len(text.split(".")[1]) if "." in text else 0


def test_the_ledger_has_rows() -> None:
    rows = ledger_rows()
    assert len(rows) >= 10
    assert all(re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]) for r in rows), rows
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]) for r in rows), rows


def test_every_figure_is_its_json() -> None:
    for row in ledger_rows():
        path = ROOT / row["json"].strip("`")
        assert path.is_file(), f"{row['figure']}: {path} is not committed"
        figure = lookup(json.loads(path.read_text(encoding="utf-8")), row["key"].strip("`"))
        number, decimals = stated(row["value"])
        assert round(figure, decimals) == number, (row["figure"], figure, row["value"])
