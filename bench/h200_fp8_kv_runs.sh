#!/usr/bin/env bash
# FP8 KV cache (issue 45 part 2) on one H100/H200, in one device call; JSON in $OUT.
#   bash bench/h200_fp8_kv_runs.sh
# 1. tests/gpu/test_gpu_fp8_kv.py: rope+cache write, decode kernel (eager, graphed, rope), flash and
#    padded prefill over an e4m3 cache against the torch reference; an fp8-KV engine (2x blocks).
# 2. bench/fp8_kv.py: 8B shape, random weights; KV blocks and concurrent 4,096-token sequences for bf16
#    against fp8 KV, and decode tok/s in lockstep at that concurrency.
set -u
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -n "${SKIP_TESTS:-}" ] || timeout 200 python3 -m pytest -q tests/gpu/test_gpu_fp8_kv.py tests/replica/test_fp8_kv_kernels.py \
  --confcutdir=tests/gpu -p no:cacheprovider 2>&1 | tail -6
timeout 300 python3 -m bench.fp8_kv --out "$out/fp8_kv.json" 2>&1 | tail -24
