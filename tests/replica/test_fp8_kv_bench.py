"""bench/fp8_kv.py's smoke mode runs on the CPU: the bf16 half serves, the fp8 half is skipped with the
reason, and the sizing rule gives the fp8 pool twice the blocks."""

from __future__ import annotations

import json

from bench.fp8_kv import main


def test_the_fp8_kv_bench_smoke_run(tmp_path) -> None:
    out = tmp_path / "fp8_kv.json"
    main(["--smoke", "--out", str(out)])
    result = json.loads(out.read_text())
    auto = result["auto"]
    assert auto["max_concurrent_seqs"] == auto["kv_tokens"] // result["seq_tokens"] >= 1
    assert auto["output_tokens"] == auto["requests"] * result["max_tokens"] and auto["decode_tok_s"] > 0
    assert "compute capability >= 8.9" in result["fp8"]["skipped"]
    assert result["fp8_blocks_by_rule"] in (2 * auto["kv_blocks"], 2 * auto["kv_blocks"] + 1)
