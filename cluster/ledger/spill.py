"""The local spill file: rows the database could not take, as JSON lines, replayed when it returns.

Each writer appends to a file of its own and holds an exclusive lock on it while it lives. When it
replays, it also takes any other spill file in the folder whose lock is free: a router that died (or
was restarted) with rows spilled leaves them to the next writer on the machine, so nothing spilled
is lost to a restart. The file is bounded: past ``max_rows`` a row is dropped and counted.

A replay first moves the file aside (``take_own``; the lock goes with it) and starts an empty one,
so rows spilled while the replay runs (a database slower than the rows: ``LedgerWriter``) are never
cleared with the replayed ones; the aside file goes once its rows are stored (``replayed``), and
stays for the next replay, or the next writer, if they are not.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from cluster.ledger.rows import LedgerRow

PREFIX = "ledger-spill-"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class SpillFile:
    """Rows waiting for the database on local disk. Blocking I/O: call from a thread."""

    def __init__(self, folder: Path, owner: str, max_rows: int) -> None:
        self.folder = Path(folder).expanduser()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{PREFIX}{_safe(owner)}.jsonl"
        self.max_rows = max_rows
        self.dropped = 0
        # One operation at a time: a spill cancelled on the writer's loop still runs in its worker
        # thread, and a close racing it saw no rows and unlinked the file the rows were going to.
        self._lock = threading.Lock()
        self._own: IO[str] = _locked(self.path)
        self.rows = sum(1 for _ in self._read(self._own))
        self._aside: IO[str] | None = None  # the file a replay took (``take_own``), still locked
        self._aside_path: Path | None = None
        self.aside_rows = 0
        self._asides = 0

    @property
    def waiting(self) -> int:
        """Rows on disk for the database: the file's and those a replay took aside."""
        return self.rows + self.aside_rows

    def append(self, rows: list[LedgerRow]) -> int:
        """Write ``rows`` (as many as the bound allows, synced); how many were written."""
        with self._lock:
            return self._append(rows)

    def _append(self, rows: list[LedgerRow]) -> int:
        room = max(0, self.max_rows - self.rows)
        kept = rows[:room]
        self.dropped += len(rows) - len(kept)
        if kept:
            self._own.write("".join(json.dumps(r.to_dict(), separators=(",", ":")) + "\n" for r in kept))
            self._own.flush()
            os.fsync(self._own.fileno())
            self.rows += len(kept)
        return len(kept)

    def others(self) -> list[Path]:
        """Spill files of writers that are gone (their lock is free)."""
        return [
            p for p in sorted(self.folder.glob(f"{PREFIX}*.jsonl")) if p != self.path and p.stat().st_size
        ]

    def read_own(self) -> list[LedgerRow]:
        with self._lock:
            return [LedgerRow.from_dict(d) for d in self._read(self._own)]

    def take_own(self) -> list[LedgerRow]:
        """The rows to replay: those an earlier replay took aside and did not store, or else the
        file's, moved aside now (new spills go to a fresh file meanwhile)."""
        with self._lock:
            if self._aside is None:
                if self.rows == 0:
                    return []
                self._asides += 1
                aside = self.folder / f"{self.path.stem}-replay-{os.getpid()}-{self._asides}.jsonl"
                os.replace(self.path, aside)  # the open file, and its lock, move with it
                self._aside, self._aside_path, self.aside_rows = self._own, aside, self.rows
                self._own, self.rows = _locked(self.path), 0
            return [LedgerRow.from_dict(d) for d in self._read(self._aside)]

    def replayed(self) -> None:
        """The rows ``take_own`` gave are stored: their file goes."""
        with self._lock:
            if self._aside is not None and self._aside_path is not None:
                self._aside_path.unlink(missing_ok=True)
                self._aside.close()
                self._aside, self._aside_path, self.aside_rows = None, None, 0

    @contextlib.contextmanager
    def adopt(self, path: Path) -> Iterator[list[LedgerRow] | None]:
        """A dead writer's rows (None if its writer still lives); the file goes if the block ends
        without an error, i.e. once the caller stored them."""
        with open(path, "a+", encoding="utf-8") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield None
                return
            yield [LedgerRow.from_dict(d) for d in self._read(f)]
            path.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            empty = self.rows == 0
            self._own.close()  # releases the file lock
            if empty:
                self.path.unlink(missing_ok=True)
            if self._aside is not None:  # not stored yet: left, unlocked, to the next writer
                self._aside.close()
                self._aside = None

    @staticmethod
    def _read(f: IO[str]) -> Iterator[dict]:
        f.seek(0)
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:  # a line cut by a crash mid-write: the rest still counts
                continue
        f.seek(0, os.SEEK_END)


def _locked(path: Path) -> IO[str]:
    """``path`` opened for appending and reading, under an exclusive lock held while it is open."""
    f = open(path, "a+", encoding="utf-8")  # noqa: SIM115  # held while alive
    fcntl.flock(f, fcntl.LOCK_EX)
    return f
