"""Per-request records (times are seconds from the run's start) and their JSONL file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

# "cut": the client's own deadline ended the request (the run's drain bound, ``loadtest/drain.py``);
# "cancelled" is what runs before that status existed wrote for the same thing (read back as cut).
Status = Literal["ok", "http_error", "timeout", "connection_error", "stream_error", "cut", "cancelled"]
RECORDS_FILE = "records.jsonl"
CUT_ERROR = "client_deadline"
LEGACY_CUT = ("cancelled", "run_deadline")


@dataclass(slots=True)
class RequestRecord:
    """What the client saw of one request; None for stages it never reached."""

    request_id: str
    tenant: str
    sla_class: str
    weight: float
    scheduled: float
    sent: float
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    end: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0  # over all of the request's answers (n > 1: usage sums them)
    max_tokens: int = 0
    status: Status = "cut"
    http_status: int | None = None
    error: str | None = None
    server_id: str | None = None
    warmup: bool = False
    choices: int = 1  # answers streamed (the request's n; last: records are also built by position)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def cut(self) -> bool:
        """Ended by the client's own deadline, not by the server: its SLA outcome is unknown, so it is
        reported apart and left out of every attainment's denominator (never an SLA miss)."""
        return self.status == "cut" or (self.status, self.error) == LEGACY_CUT

    @property
    def rejected(self) -> bool:
        """Refused by admission (HTTP 429): not served, so not counted against attainment."""
        return self.status == "http_error" and self.http_status == 429

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


_FIELDS = {f.name for f in fields(RequestRecord)}


def record_from_dict(data: dict) -> RequestRecord:
    return RequestRecord(**{k: v for k, v in data.items() if k in _FIELDS})


def write_records(path: Path, records: list[RequestRecord]) -> None:
    path.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")


def read_records(path: Path) -> list[RequestRecord]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [record_from_dict(json.loads(line)) for line in lines if line.strip()]
