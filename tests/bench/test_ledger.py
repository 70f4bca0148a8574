"""BENCHMARKS.md's ledger: every row's JSON is committed and holds the figure the row states."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["figure", "value", "date", "machine", "commit", "command", "json", "key"]
CELL_SPLIT = re.compile(r"(?<!\\)\|")  # a pipe inside a cell is written `\|`, as GitHub's tables take it
TEXT_KEY = "pytest summary"  # a row whose file is a test run's output: the value is a line of it


def ledger_rows(text: str | None = None) -> list[dict[str, str]]:
    """The rows of the first table in BENCHMARKS.md, by column name (every row: later rows go in it)."""
    rows, started = [], False
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8") if text is None else text
    for line in text.splitlines():
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        cells = [c.strip() for c in CELL_SPLIT.split(line.strip().strip("|"))]
        if cells[0] == "figure" or set(cells[0]) <= {"-"}:
            continue
        assert len(cells) == len(COLUMNS), f"a row of {len(cells)} cells: {line[:160]}"
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


def lookup(data: dict | list, dotted: str) -> float:
    """The value at a dotted path; a part that indexes a list is its position (`waits.0.s`)."""
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return float(data)


def stated(value: str) -> tuple[float, int, bool]:
    """The row's number, its decimals and whether it is a percent: '5,782 tok/s' -> (5782.0, 0,
    False), '0.993×' -> (0.993, 3, False), '−0.081' -> (-0.081, 3, False), '+5.09%' -> (5.09, 2, True)."""
    match = re.search(r"([−+-]?)([0-9][0-9,]*(?:\.[0-9]+)?)(\s*%)?", value)
    assert match, value
    sign, text, percent = match.groups()
    text = text.replace(",", "")
    number = -float(text) if sign in ("−", "-") else float(text)
    return number, len(text.split(".")[1]) if "." in text else 0, percent is not None


def holds(row: dict[str, str]) -> None:
    cell = row["json"]  # the file's path, in backticks, maybe with a note after it
    path = ROOT / (cell.split("`")[1] if "`" in cell else cell)
    assert path.is_file(), f"{row['figure']}: {path} is not committed"
    content = path.read_text(encoding="utf-8")
    if row["key"] == TEXT_KEY:
        assert row["value"] in content, (row["figure"], row["value"], path)
        return
    figure = lookup(json.loads(content), row["key"].strip("`"))
    number, decimals, percent = stated(row["value"])
    figure = figure * 100 if percent else figure
    assert round(figure, decimals) == number, (row["figure"], figure, row["value"])


def test_the_ledger_has_rows() -> None:
    rows = ledger_rows()
    assert len(rows) >= 10
    assert all(re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]) for r in rows), rows
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]) for r in rows), rows


def test_every_figure_is_its_json() -> None:
    for row in ledger_rows():
        holds(row)


def test_a_row_after_the_table_is_still_a_row_of_it() -> None:
    """Rows once appended after a paragraph were outside the checked table; every row is in it now,
    and one put anywhere else would make the counts differ."""
    lines = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| figure")]
    assert len(ledger_rows()) == len(rows)


def test_the_stated_figure_is_read_with_its_sign_and_percent() -> None:
    assert stated("5,782 tok/s") == (5782.0, 0, False)
    assert stated("−0.081") == (-0.081, 3, False)
    assert stated("+5.09%") == (5.09, 2, True)
    table = "| figure | value |\n|---|---|\n| a `x\\|y` b | 1 | d | m | c | k | j | y |"
    assert ledger_rows(table)[0]["figure"] == "a `x\\|y` b"
