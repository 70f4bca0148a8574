"""A self-contained HTML page (figures inlined as base64 PNG) from summaries and figure files."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
th{background:#f0f0f0}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:1em}
.note{color:#555;font-size:13px}
"""


def image_tag(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def rich_table_html(table: Table) -> str:
    """A rich Table as an HTML table (same columns and cells as the terminal)."""
    head = "".join(f"<th>{html.escape(str(c.header))}</th>" for c in table.columns)
    cells = [list(c.cells) for c in table.columns]
    rows = [
        "".join(f"<td>{html.escape(str(cells[j][i]))}</td>" for j in range(len(cells)))
        for i in range(table.row_count)
    ]
    title = f"<h3>{html.escape(str(table.title))}</h3>" if table.title else ""
    return title + f"<table><tr>{head}</tr>" + "".join(f"<tr>{r}</tr>" for r in rows) + "</table>"


def page(title: str, notes: Sequence[str], tables: Sequence[Table], figures: Sequence[Path]) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
    ]
    parts += [f"<p class='note'>{html.escape(n)}</p>" for n in notes]
    parts += [rich_table_html(t) for t in tables]
    parts.append("<div class='grid'>" + "".join(image_tag(f) for f in figures) + "</div></body></html>")
    return "".join(parts)


def print_tables(tables: Sequence[Table], console: Console | None = None) -> None:
    console = console or Console(width=180)
    for t in tables:
        console.print(t)
