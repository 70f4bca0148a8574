"""JSON answers whose figures may hold an infinity or a NaN: those are sent as null.

JSON has neither, and Starlette's ``JSONResponse`` refuses them (``allow_nan=False``): the
``ValueError`` reached the routers' error mapping as a bad request. So once every ``/admin/state``
call answered 400 for as long as the SLA policy's decision predicted a backlog no replica count
drains (an infinite TTFT). The operator's views (``/admin/*``, the SLA and usage reports) answer
with this class, so a figure without a finite value reads null, and the rest of the answer stands.
"""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse


def finite(value: Any) -> Any:
    """``value`` with every non-finite float, however deep in dicts, lists and tuples, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


class FiniteJSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return super().render(finite(content))
