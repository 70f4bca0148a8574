"""The operator's views answer JSON whose non-finite figures read null (``cluster/edge/finite_json.py``):
an infinity in the SLA policy's decision once made every ``/admin/state`` call a 400."""

from __future__ import annotations

import json
import math

import pytest
from starlette.responses import JSONResponse

from cluster.edge.finite_json import FiniteJSON, finite

DECISION = {
    "desired": 3,
    "predictions": [{"replicas": 1, "ttft_s": {"interactive": math.inf}, "tpot_s": math.nan}],
    "inputs": ({"measured_ttft_s": -math.inf, "within_rps": 7.85},),
    "reason": "up",
}


def test_starlettes_json_refuses_what_finite_json_answers() -> None:
    with pytest.raises(ValueError, match="Out of range float"):
        JSONResponse({"models": {"m": {"autoscaling": DECISION}}})
    body = json.loads(FiniteJSON({"models": {"m": {"autoscaling": DECISION}}}).body)
    decision = body["models"]["m"]["autoscaling"]
    assert decision["predictions"][0] == {"replicas": 1, "ttft_s": {"interactive": None}, "tpot_s": None}
    assert decision["inputs"] == [{"measured_ttft_s": None, "within_rps": 7.85}]
    assert decision["desired"] == 3 and decision["reason"] == "up"


def test_finite_values_and_other_types_pass_unchanged() -> None:
    value = {"a": [1, 2.5, "x", None, True], "b": {"c": -0.0}}
    assert finite(value) == value
    assert finite(math.inf) is None and finite(1e308) == 1e308
