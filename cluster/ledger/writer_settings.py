"""The writer's settings (``writer.py``): its pace, its bounds, and when the router sheds load."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WriterSettings:
    interval_s: float = 0.2  # the spool's (and the idle drain's) tick
    batch_rows: int = 500  # this many queued wake the drain at once
    write_rows: int = 2_000  # rows per insert at most (PostgreSQL: one COPY)
    retry_s: float = 1.0  # after a failed write, the database is tried again this much later
    write_timeout_s: float = 10.0  # one insert, at most: past it, an outage
    behind_after_s: float = 5.0  # rows waiting longer than this: /health says "behind"
    queue_rows: int = 50_000  # the hand-over queue's bound; past it a row is dropped and counted
    # Rows queued while the database takes a batch: past this many, the writer starts spilling
    # (a database slower than the rows), so memory never holds much that a kill would lose.
    spill_after_rows: int = 5_000
    # Backpressure: the router sheds new requests (503) once the spill file or the queue is this
    # full, leaving the rest for requests already admitted (``backpressure.py``).
    shed_at: float = 0.9
