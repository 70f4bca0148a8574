#!/usr/bin/env bash
# Multi-LoRA (issue 44) and FP8 weights (issue 45) on one H200, in one device call; JSON in $OUT.
#   bash bench/h200_lora_fp8_runs.sh
# 1. tests/gpu/test_gpu_lora.py and tests/gpu/test_gpu_fp8.py (kernels, graphed against eager, engines).
# 2. bench/lora_step.py: 8B shape, random weights, rank-16 adapters on all seven modules; graphed decode
#    step time of the base engine (LoRA off), the LoRA engine with no adapter in the batch, and 1/8/32
#    distinct adapters, at decode batches 32 and 128.
# 3. bench/fp8_step.py: 8B shape, random weights; the four linears × 32 layers and the whole graphed
#    decode step (512 cached tokens each), bf16 against FP8, at batches 1, 16, 64, 256.
set -u
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -n "${SKIP_TESTS:-}" ] || timeout 200 python3 -m pytest -q tests/gpu/test_gpu_lora.py tests/gpu/test_gpu_fp8.py \
  --confcutdir=tests/gpu -p no:cacheprovider 2>&1 | tail -4
timeout 240 python3 -m bench.lora_step --out "$out/lora_step.json" --tokens 64 2>&1 | tail -14
timeout 120 python3 -m bench.fp8_step --out "$out/fp8_step.json" 2>&1 | tail -12
