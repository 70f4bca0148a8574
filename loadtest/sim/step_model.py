"""The simulated replica's step time: ``step_ms = a + b·batch + c·prefill_tokens + d·Σcontext``.

Coefficients are fitted (least squares) from measured engine step profiles, or derived from the
GPU benchmark summaries; each JSON in ``loadtest/sim/data/`` says where its numbers came from.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured step: its batch, prefill tokens, Σ attention context and duration."""

    batch: int
    prefill_tokens: int
    context: int
    step_ms: float


@dataclass(frozen=True, slots=True)
class StepModel:
    """Linear step-time model, milliseconds; ``name`` labels reports."""

    a: float
    b: float
    c: float
    d: float
    name: str = "custom"

    def step_ms(self, batch: int, prefill_tokens: int = 0, context: int = 0) -> float:
        return self.a + self.b * batch + self.c * prefill_tokens + self.d * context

    def as_dict(self) -> dict[str, float]:
        return {
            "a_ms": self.a,
            "b_ms_per_seq": self.b,
            "c_ms_per_prefill_token": self.c,
            "d_ms_per_context_token": self.d,
        }

    def decode_tokens_per_s(self, batch: int, context_per_seq: float) -> float:
        """Output tokens per second of a full decode batch (capacity estimates)."""
        return 1000.0 * batch / self.step_ms(batch, 0, int(batch * context_per_seq))


def fit(samples: list[StepSample]) -> tuple[StepModel, dict]:
    """Least squares on the four features; negative coefficients are clamped to 0 and refitted."""
    if len(samples) < 8:
        raise ValueError(f"need at least 8 step samples to fit, got {len(samples)}")
    x = np.array([[1.0, s.batch, s.prefill_tokens, s.context] for s in samples])
    y = np.array([s.step_ms for s in samples])
    active = [0, 1, 2, 3]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [active[i] for i, v in enumerate(coef) if v < 0 and active[i] != 0]
        if not negative:
            break
        active = [i for i in active if i not in negative]
    full = np.zeros(4)
    full[active] = coef
    pred = x @ full
    resid = y - pred
    stats = {
        "samples": len(samples),
        "r2": float(1 - resid.var() / y.var()) if y.var() > 0 else 1.0,
        "mean_abs_error_ms": float(np.abs(resid).mean()),
        "median_rel_error": float(np.median(np.abs(resid) / np.maximum(y, 1e-9))),
        "batch_range": [int(x[:, 1].min()), int(x[:, 1].max())],
        "prefill_range": [int(x[:, 2].min()), int(x[:, 2].max())],
        "context_range": [int(x[:, 3].min()), int(x[:, 3].max())],
        "clamped_to_zero": [("a", "b", "c", "d")[i] for i in range(4) if i not in active],
    }
    return StepModel(*(float(v) for v in full)), stats


def load_step_model(name_or_path: str | Path) -> StepModel:
    """A shipped model by name (``cpu-smollm2``, ``h200-llama-8b``, ...) or a JSON path."""
    path = Path(name_or_path)
    if not path.exists():
        path = DATA_DIR / f"step_{name_or_path}.json"
    if not path.exists():
        shipped = ", ".join(sorted(p.stem.removeprefix("step_") for p in DATA_DIR.glob("step_*.json")))
        raise FileNotFoundError(f"no step model {name_or_path!r}; shipped: {shipped}")
    data = json.loads(path.read_text())
    coeffs = (
        data["a_ms"],
        data["b_ms_per_seq"],
        data["c_ms_per_prefill_token"],
        data["d_ms_per_context_token"],
    )
    if not all(math.isfinite(v) and v >= 0 for v in coeffs) or coeffs[0] <= 0:
        raise ValueError(f"{path}: step model coefficients must be finite, >= 0, with a > 0")
    return StepModel(*coeffs, name=data.get("name", path.stem))
