"""An ASGI middleware that stamps when each HTTP request entered the router's app.

The router's timing record starts at ``arrival``, after the body is parsed and validated, the key
checked and the prompt templated and tokenized. A client's time to first token also holds that
part (and the loop's wait before it); the stamp, kept in the request's scope, lets the timing
record say how long it was (``RequestTiming.received``). Outermost, so every other layer is in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

RECEIVED_KEY = "fairlane.received"


class ReceivedStamp:
    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        scope[RECEIVED_KEY] = time.monotonic()
        await self.app(scope, receive, send)
