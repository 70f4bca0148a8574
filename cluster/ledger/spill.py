"""The local spill: rows the database has not taken yet, on disk, replayed in order (issue 43).

A writer owns a log of numbered segment files, ``ledger-spill-<owner>-<token>-<seq>.jsonl``, one
JSON row per line. New rows go to the last segment (the tail), written and fsync'd once per batch;
the replay reads the oldest segment a chunk at a time and deletes it once every row in it is stored.
When the replay reaches the tail, the tail is sealed and new rows start a fresh segment, so a replay
never reads a file that is still growing and never deletes a row spilled while it ran.

Each segment is held under an exclusive ``flock`` while its writer lives. A file whose lock is free
belongs to a writer that is gone (stopped, crashed, killed): any writer sharing the folder adopts it
and replays it the same way, a chunk at a time. A line cut by a crash is skipped, the rest replayed.
Rows are stored with ``ON CONFLICT DO NOTHING`` on the request id, so a segment replayed twice (a
crash between the insert and the delete) stores each row once.

The log is bounded (``max_rows``): an append past it keeps what fits and says how many; the writer
keeps the rest in memory and the router sheds load before either bound is reached (``writer.py``).
Not thread-safe: every call runs on the writer's one spill thread (``spill_io.py``), in order.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson

from cluster.ledger.rows import LedgerRow

PREFIX = "ledger-spill-"
SEGMENT_ROWS = 20_000  # a segment this long is sealed: replayed and deleted as a unit


class SpillClosed(RuntimeError):
    """An append after the close: the caller keeps (and counts) its rows."""


@dataclass(slots=True)
class Segment:
    """One spill file, open and locked; ``rows`` counts what this writer appended (-1: adopted)."""

    path: Path
    file: IO[bytes]
    rows: int = 0

    @property
    def adopted(self) -> bool:
        return self.rows < 0


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _encode(rows: list[LedgerRow]) -> bytes:
    return b"".join(orjson.dumps(r.to_dict()) + b"\n" for r in rows)


class SpillLog:
    """This writer's segments, oldest first, and the dead writers' files it adopts."""

    def __init__(self, folder: Path, owner: str, max_rows: int, segment_rows: int = SEGMENT_ROWS) -> None:
        self.folder = Path(folder).expanduser()
        self.folder.mkdir(parents=True, exist_ok=True)
        # A token per log: a restarted writer with the same owner never appends to a file it did
        # not write (its predecessor's files are adopted like any other dead writer's).
        self.stem = f"{PREFIX}{_safe(owner)}-{uuid.uuid4().hex[:8]}"
        self.max_rows = max_rows
        self.segment_rows = segment_rows
        self.rows = 0  # rows in this writer's own segments
        self.closed = False
        self._sealed: deque[Segment] = deque()
        self._tail: Segment | None = None
        self._seq = 0

    @property
    def waiting(self) -> int:
        """Rows this writer spilled that are not stored yet."""
        return self.rows

    @property
    def room(self) -> int:
        return max(0, self.max_rows - self.rows)

    # ---- appending ----------------------------------------------------------------------------------
    def append(self, rows: list[LedgerRow]) -> int:
        """Write as many of ``rows`` as the bound allows, in order, and fsync; how many."""
        if self.closed:
            raise SpillClosed("the spill log is closed")
        kept = rows[: self.room]
        if not kept:
            return 0
        tail = self._open_tail()
        try:
            tail.file.write(_encode(kept))
            tail.file.flush()
            os.fsync(tail.file.fileno())  # once per batch: a crash after this loses none of them
        except OSError:
            self._abandon_tail()
            raise
        tail.rows += len(kept)
        self.rows += len(kept)
        if tail.rows >= self.segment_rows:
            self.seal()
        return len(kept)

    def _open_tail(self) -> Segment:
        if self._tail is None:
            self._seq += 1
            self._tail = Segment(*_locked(self.folder / f"{self.stem}-{self._seq:06d}.jsonl"))
        return self._tail

    def _abandon_tail(self) -> None:
        """A write failed part-way (a full disk): the next row must not follow a cut line, so the
        tail is sealed as it is (its cut last line is skipped at the replay; the caller keeps the
        batch's rows, and those that did reach the file are stored once) and a new one starts."""
        tail = self._tail
        if tail is not None and tail.rows == 0:
            with contextlib.suppress(OSError):  # its buffer cannot be written either
                tail.file.close()
            tail.path.unlink(missing_ok=True)
            self._tail = None
        self.seal()

    def seal(self) -> None:
        """The tail stops growing: it can be replayed; the next append starts a new segment."""
        if self._tail is not None and self._tail.rows > 0:
            self._sealed.append(self._tail)
            self._tail = None

    # ---- replaying ----------------------------------------------------------------------------------
    def oldest(self) -> Segment | None:
        """The oldest own segment to replay (sealing the tail when none is sealed), else None."""
        if not self._sealed:
            self.seal()
        return self._sealed[0] if self._sealed else None

    def others(self) -> list[Path]:
        """Spill files in the folder that are not this writer's (their writers may be gone)."""
        mine = {s.path for s in self._sealed} | ({self._tail.path} if self._tail else set())
        return [
            p
            for p in sorted(self.folder.glob(f"{PREFIX}*.jsonl"))
            if p not in mine and p.exists() and p.stat().st_size
        ]

    def adopt(self, path: Path) -> Segment | None:
        """A dead writer's file, locked for this writer (None if its writer lives or it is gone)."""
        try:
            f = open(path, "r+b")  # noqa: SIM115  # held, locked, until replayed
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return None
        if not path.exists():  # replayed and deleted by another writer between the glob and the lock
            f.close()
            return None
        return Segment(path, f, rows=-1)

    @staticmethod
    def read(segment: Segment, offset: int, max_rows: int) -> tuple[list[LedgerRow], int, bool]:
        """Up to ``max_rows`` rows from byte ``offset``: the rows, the offset after them, and whether
        the file ends there. Lines that do not parse (cut by a crash) are skipped."""
        f = segment.file
        f.seek(offset)
        out: list[LedgerRow] = []
        while len(out) < max_rows:
            line = f.readline()
            if not line:
                return out, f.tell(), True
            try:
                out.append(LedgerRow.from_dict(orjson.loads(line)))
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
        end = f.tell()
        return out, end, not f.read(1)

    def done(self, segment: Segment) -> None:
        """Every row of ``segment`` is stored: its file goes."""
        segment.path.unlink(missing_ok=True)
        segment.file.close()
        if segment.adopted:
            return
        self.rows -= segment.rows
        if self._sealed and self._sealed[0] is segment:
            self._sealed.popleft()

    def release(self, segment: Segment) -> None:
        """An adopted file not replayed to its end: its lock goes, the file stays for the next writer."""
        if segment.adopted:
            segment.file.close()

    # ---- closing ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release every lock; files with rows stay for the next writer, empty ones go."""
        self.closed = True
        segments = list(self._sealed) + ([self._tail] if self._tail is not None else [])
        for s in segments:
            if s.rows == 0:
                s.path.unlink(missing_ok=True)
            s.file.close()
        self._sealed.clear()
        self._tail = None


def _locked(path: Path) -> tuple[Path, IO[bytes]]:
    """``path`` opened for appending and reading, under an exclusive lock held while it is open."""
    f = open(path, "a+b")  # noqa: SIM115  # held while alive
    fcntl.flock(f, fcntl.LOCK_EX)
    return path, f
