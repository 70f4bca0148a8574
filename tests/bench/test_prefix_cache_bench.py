"""bench/prefix_cache.py's arithmetic on hand-made arrival times: TPOT, ITL, the poisson rate, flags."""

from __future__ import annotations

import argparse

import pytest

from bench import engine_trace
from bench.prefix_cache import parser, poisson_rate, summarise_run


def record(sent: float, stamps: list[float], cached: int = 0, cacheable: int = 0) -> dict:
    return {"sent": sent, "stamps": stamps, "prompt": 100, "cached": cached, "cacheable": cacheable,
            "end": stamps[-1]}  # fmt: skip


def test_tpot_and_itl_follow_engine_trace_with_burst_tokens_as_zero_gaps() -> None:
    # Request a: 4 tokens, the 2nd and 3rd in one output (one arrival time); request b: 2 tokens.
    records = [record(0.9, [1.0, 1.1, 1.1, 1.3], 32, 64), record(1.5, [2.0, 2.5], 64, 64)]
    r = summarise_run(records, wall=2.0, conversations=1)
    assert r["ttft_ms_p50"] == pytest.approx(300.0)  # 100 and 500 ms
    # TPOT per request: (last − first) / (tokens − 1) = 100 and 500 ms.
    assert r["tpot_ms_p50"] == pytest.approx(300.0)
    assert r["tpot_ms_p99"] == pytest.approx(100 + 0.99 * 400)
    # ITL pooled over requests: 100, 0, 200 (a) and 500 (b) ms.
    assert r["itl_ms_p50"] == pytest.approx(150.0)
    assert r["itl_ms_p99"] == pytest.approx(200 + 0.97 * 300)
    assert r["output_tokens"] == 6 and r["output_tokens_per_s"] == pytest.approx(3.0)
    assert r["requests_per_s"] == pytest.approx(1.0) and r["conversations_per_s"] == pytest.approx(0.5)
    assert r["hit_rate_of_cacheable"] == pytest.approx(96 / 128)


def test_uses_engine_trace_summarise() -> None:
    """One definition of TPOT and ITL: the bench calls engine_trace's, it does not carry a copy."""
    import bench.prefix_cache as pc

    assert pc.summarise is engine_trace.summarise


def test_rate_is_the_fraction_of_the_cache_off_saturation_capacity() -> None:
    args = argparse.Namespace(rate=None, rate_fraction=0.8, conversations=50)
    rate = poisson_rate(args, {"wall_s": 20.0, "requests_per_s": 12.5})
    assert rate["conversations_per_s"] == pytest.approx(0.8 * 50 / 20.0)
    assert rate["capacity_conversations_per_s"] == pytest.approx(2.5)
    assert rate["capacity_requests_per_s"] == 12.5 and rate["rate_fraction"] == 0.8


def test_a_fixed_rate_is_not_derived() -> None:
    args = argparse.Namespace(rate=1.5, rate_fraction=0.8, conversations=50)
    assert poisson_rate(args, {"wall_s": 20.0, "requests_per_s": 12.5}) == {
        "conversations_per_s": 1.5,
        "source": "--rate",
    }


def test_parser_has_no_caching_flag_and_one_way_to_set_the_rate() -> None:
    args = parser().parse_args([])
    assert args.rate is None and args.rate_fraction == 0.8 and not hasattr(args, "prefix_caching")
    assert parser().parse_args(["--rate", "2"]).rate == 2.0
    with pytest.raises(SystemExit):
        parser().parse_args(["--prefix-caching"])  # the bench runs caching on and off itself
    with pytest.raises(SystemExit):
        parser().parse_args(["--rate", "2", "--rate-fraction", "0.5"])
    assert engine_trace.parser().parse_args(["--prefix-caching"]).prefix_caching  # still there
