"""The answer HAProxy gives when no router answered a request: fairlane's JSON 503, not Serve's page.

HAProxy answers a request itself when every try failed (its retries spent, or neither a router nor
Serve's fallback proxy up: 503), when a router closed the connection partway through its headers
(502), or timed out (504). Serve's config sends all three to its own page, a plain-text ``500
Internal Server Error``, which an OpenAI client cannot read as an error. ``edge.py`` points HAProxy
at this file instead: the OpenAI error body of a 503 (``router_unavailable``) with Retry-After, as a
router's own 503s. HAProxy reads an error file as a raw HTTP response, whole, when it loads its
config (at start and at each reload).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from cluster.errors import ServiceUnavailable, classify, error_body

FILE_NAME = "router_unavailable.http"
RETRY_AFTER_S = 1  # a router that died is restarted by Serve; the others take the retry meanwhile
MESSAGE = "no router could take the request (one stopped, or none is up); retry it"


def router_unavailable_reply() -> bytes:
    """The whole HTTP response: status line, headers and the OpenAI error body."""
    info = classify(
        ServiceUnavailable(MESSAGE, code="router_unavailable", headers={"retry-after": str(RETRY_AFTER_S)})
    )
    body = json.dumps(error_body(info)).encode()
    head = [
        f"HTTP/1.1 {info.status} Service Unavailable",
        "content-type: application/json",
        *(f"{name}: {value}" for name, value in info.headers.items()),
        "cache-control: no-store",
        f"content-length: {len(body)}",  # HAProxy refuses an error file whose length is wrong
    ]
    return "\r\n".join(head).encode() + b"\r\n\r\n" + body


def write_error_file(directory: Path | None = None) -> Path:
    """The reply in ``directory`` (a ``fairlane-edge`` folder in the temp dir by default); its path.

    Replaced atomically: an HAProxy loading its config meanwhile reads the old file or the new one,
    never half of one (two clusters on one machine write the same bytes)."""
    directory = directory or Path(tempfile.gettempdir()) / "fairlane-edge"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE_NAME
    partial = directory / f".{FILE_NAME}.{os.getpid()}"
    partial.write_bytes(router_unavailable_reply())
    partial.replace(path)
    return path
