"""bench/fp8_serving_table.py: the FP8 serving runs' ratios and targets from their JSON."""

from __future__ import annotations

import json
from pathlib import Path

from bench.fp8_serving_table import summarise


def _write(folder: Path, name: str, body: dict) -> None:
    (folder / f"{name}.json").write_text(json.dumps(body))


def _trace(tok_s_20: float, tok_s_inf: float, tpot_20: float) -> dict:
    row = dict(ttft_ms_p50=50.0, ttft_ms_p99=200.0, itl_ms_p50=10.0, itl_ms_p99=30.0)
    return {
        "cuda": "H200",
        "results": {
            "mixed@20": {**row, "output_tokens_per_s": tok_s_20, "tpot_ms_p50": tpot_20},
            "mixed@inf": {**row, "output_tokens_per_s": tok_s_inf, "tpot_ms_p50": 30.0},
        },
    }


def test_ratios_are_fp8_over_bf16_and_targets_follow_their_direction(tmp_path: Path) -> None:
    _write(tmp_path, "lockstep_bf16", {"results": {"async": {"output_tokens_per_s": 2000.0}}})
    _write(tmp_path, "lockstep_fp8", {"results": {"async": {"output_tokens_per_s": 2600.0}}})
    _write(tmp_path, "trace_bf16", _trace(3000.0, 6000.0, 16.0))
    _write(tmp_path, "trace_fp8", _trace(3000.0, 8400.0, 11.2))
    rep = summarise(tmp_path)
    assert rep["ratios"]["lockstep_tok_s"] == 1.3
    assert abs(rep["ratios"]["trace_inf_tok_s"] - 1.4) < 1e-12
    assert abs(rep["ratios"]["trace_20_tpot_p50"] - 0.7) < 1e-12
    # 1.3x lockstep misses >= 1.5; 1.4x at saturation meets >= 1.3; 0.7x TPOT meets <= 0.75
    assert rep["targets"] == {"lockstep_tok_s": False, "trace_inf_tok_s": True, "trace_20_tpot_p50": True}
    assert rep["missing"] == []


def test_a_run_cut_off_is_named_and_its_ratios_left_out(tmp_path: Path) -> None:
    _write(tmp_path, "lockstep_bf16", {"results": {"async": {"output_tokens_per_s": 2000.0}}})
    _write(tmp_path, "trace_bf16", _trace(3000.0, 6000.0, 16.0))
    rep = summarise(tmp_path)
    assert rep["missing"] == ["lockstep_fp8", "trace_fp8"]
    assert rep["ratios"] == {} and rep["targets"] == {}
