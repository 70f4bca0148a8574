"""Log-spaced latency bins: how the rollup keeps a mergeable summary of each hour's latencies.

Bin 0 holds values at or below ``FLOOR_S`` (reported as 0); bin i ≥ 1 holds
[FLOOR_S·e^((i−1)/B), FLOOR_S·e^(i/B)), B = ``BINS_PER_E`` = 200, so each bin spans 0.5 % of its
values. Values past ``CEILING_S`` share the last bin. A percentile is the geometric middle of the bin
holding its nearest rank, within e^(0.5/B) − 1 = 0.25 % of the exact value. Histograms of any hours
and groups merge by adding counts, which is what makes an hourly rollup answer a month.

Stored as text, the same on both databases (SQL builds it, no Python touches a row): per occupied
bin, the bin and its count as 4 hex digits each (``printf`` in SQLite, ``to_hex`` in PostgreSQL); a
count of 65,536 or more adds a second pair, the bin + 0x8000 and the count's multiples of 65,536.
"""

from __future__ import annotations

import math

import numpy as np

LATENCY_COLUMNS = ("ttft_s", "tpot_s", "e2e_s", "queue_wait_s")  # what the rollup keeps
BINS_PER_E = 200
FLOOR_S = 1e-6
CEILING_S = 1e9  # 31 years: no latency; keeps the bin in 4 hex digits and the logarithm finite
LAST_BIN = math.floor(math.log(CEILING_S / FLOOR_S) * BINS_PER_E) + 1
BIN_COUNT = LAST_BIN + 1
ERROR_BOUND = math.exp(0.5 / BINS_PER_E) - 1  # 0.0025
PAIR = np.dtype([("bin", ">u2"), ("n", ">u2")])
HIGH = 0x8000  # a pair's bin flag: its count is in units of 65,536


def bin_sql(column: str) -> str:
    """The bin of ``column`` (a latency, not NULL) in SQL both databases run (ln, floor: SQLite's
    math functions, built in since 3.35)."""
    return (
        f"CASE WHEN {column} <= {FLOOR_S!r} THEN 0 WHEN {column} >= {CEILING_S!r} THEN {LAST_BIN} "
        f"ELSE CAST(floor(ln({column} / {FLOOR_S!r}) * {BINS_PER_E}) AS INTEGER) + 1 END"
    )


def pair_sql(dialect: str, b: str, n: str) -> str:
    """One (bin, count) as 8 hex digits, or 16 for a count of 65,536 or more."""
    if dialect == "postgresql":
        low = f"lpad(to_hex({b}), 4, '0') || lpad(to_hex({n} % 65536), 4, '0')"
        high = f"lpad(to_hex({b} + {HIGH}), 4, '0') || lpad(to_hex({n} / 65536), 4, '0')"
    else:
        low = f"printf('%04x%04x', {b}, {n} % 65536)"
        high = f"printf('%04x%04x', {b} + {HIGH}, {n} / 65536)"
    return f"{low} || CASE WHEN {n} >= 65536 THEN {high} ELSE '' END"


def concat_sql(dialect: str, expr: str) -> str:
    """The pairs of a group, concatenated (in no particular order: counts add up in any)."""
    if dialect == "postgresql":
        return f"string_agg({expr}, '')"
    return f"group_concat({expr}, '')"


def decoded(encoded: str) -> tuple[np.ndarray, np.ndarray]:
    """Bins and counts of stored histograms (any number concatenated)."""
    pairs = np.frombuffer(bytes.fromhex(encoded), dtype=PAIR)
    bins, counts = pairs["bin"].astype(np.int64), pairs["n"].astype(np.int64)
    high = bins >= HIGH
    return np.where(high, bins - HIGH, bins), np.where(high, counts << 16, counts)


def dense(parts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Counts per bin of (bins, counts) parts: the merge."""
    if not parts:
        return np.zeros(BIN_COUNT, dtype=np.int64)
    bins = np.concatenate([b for b, _ in parts])
    counts = np.concatenate([n for _, n in parts])
    return np.bincount(bins, weights=counts, minlength=BIN_COUNT).astype(np.int64)


def bin_of(value: float) -> int:
    """Python's ``bin_sql`` (tests)."""
    if value <= FLOOR_S:
        return 0
    if value >= CEILING_S:
        return LAST_BIN
    return math.floor(math.log(value / FLOOR_S) * BINS_PER_E) + 1


def middle(b: int) -> float:
    return 0.0 if b == 0 else FLOOR_S * math.exp((b - 0.5) / BINS_PER_E)


def ranks(hist: np.ndarray, percentiles: tuple[int, ...]) -> dict[str, float | None]:
    """Nearest-rank percentiles of a dense histogram: the middle of the bin holding each rank."""
    total = int(hist.sum())
    if total == 0:
        return {f"p{p}": None for p in percentiles}
    cumulative = np.cumsum(hist)
    out: dict[str, float | None] = {}
    for p in percentiles:
        rank = max(1, math.ceil(p / 100 * total))
        out[f"p{p}"] = middle(int(np.searchsorted(cumulative, rank)))
    return out
