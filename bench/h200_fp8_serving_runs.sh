#!/usr/bin/env bash
# FP8 on one H100/H200 (issue 45), in one device call (~8 min); JSON in $OUT.
#   bash bench/h200_fp8_serving_runs.sh        (carry .device: the trace's JSON schemas need llguidance)
# 1. tests/gpu/test_gpu_fp8_kv.py (the decode kernel widening e4m3 to float16 and to bfloat16).
# 2. bench/decode_attention.py over an e4m3 cache: widened to float16 against bfloat16, tokens per
#    iteration 128/256, at the FP8 KV capacity of the 8B shape (216 sequences of 4,096 tokens), and
#    the bf16 cache at its own capacity (108) beside it.
# 3. FP8 weights ÷ bf16, 8B shape, random weights, each engine in a process of its own: lockstep
#    (32 x 256/512, greedy) and the realistic sampled trace (300 requests, 20 req/s and all at once).
# 4. bench/fp8_serving_table.py: the ratios against the issue's targets.
set -u
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
source bench/device_python.sh  # the packed packages where the GPU image lacks them (llguidance)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -n "${SKIP_TESTS:-}" ] || timeout 150 python3 -m pytest -q tests/gpu/test_gpu_fp8_kv.py \
  --confcutdir=tests/gpu -p no:cacheprovider 2>&1 | tail -4
attn() { timeout 60 python3 -m bench.decode_attention --contexts 4096 --layers 8 --splits 1 --stages 2,3 "$@" | tail -9; }
attn --kv-dtype fp8 --batch 216 --widen fp16,bf16 --tokens 128,256 --json "$out/decode_attention_fp8.json"
attn --kv-dtype bf16 --batch 108 --tokens 64,128 --json "$out/decode_attention_bf16.json"
for q in bf16 fp8; do
  flag=(); [ "$q" = fp8 ] && flag=(--quantization fp8)
  timeout 100 python3 -m bench.engine_lockstep --model llama-3.1-8b --random-weights --device cuda --modes async \
    --batch 32 --prompt-len 256 --max-tokens 512 --repeats 3 "${flag[@]}" --json "$out/lockstep_$q.json" | tail -3
done
for q in bf16 fp8; do
  flag=(); [ "$q" = fp8 ] && flag=(--quantization fp8)
  timeout 130 python3 -m bench.engine_trace --model llama-3.1-8b --random-weights --device cuda --mixes mixed \
    --rates 20,inf --requests 300 "${flag[@]}" --json "$out/trace_$q.json" | tail -4
done
python3 -m bench.fp8_serving_table "$out"
