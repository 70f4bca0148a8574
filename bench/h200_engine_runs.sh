#!/usr/bin/env bash
# The engine's GPU runs for BENCHMARKS.md, in one device call (about 6 minutes on the H200):
# GPU tests, then SmolLM2 / 1B / 8B shapes side by side (async, sync, transformers), host prepare at
# 256 sequences, and a kernel profile of the 8B prefill. JSON lands in $OUT (default ./out).
#   bash bench/h200_engine_runs.sh [hf-cb]   # with hf-cb: transformers' generate_batch too (8B shape;
#                                              # on SmolLM2 it did not finish within 90 s)
#   PROFILE=1 bash bench/h200_engine_runs.sh  # and the 8B prefill and decode kernel profiles, and the
#                                               # decode attention / K-slice GEMM benchmarks
set -u
out=${OUT:-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cb=${1:-}; extra=""; [ "$cb" = hf-cb ] && extra=",hf-cb"
bench() { timeout 300 python3 -m bench.engine_lockstep --random-weights --device cuda "$@"; }
# Engine modes repeat the same batch (median reported, every run's tok/s in runs_tok_s): eager prefill
# steps are host-bound, and one run of the small shapes varied by 15% from the next.
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
timeout 240 python3 -m pytest tests/gpu --confcutdir=tests/gpu -q -p no:cacheprovider 2>&1 | tail -4
bench --model smollm2-135m --batch 32 --prompt-len 256 --max-tokens 512 --modes async,sync --repeats 5 \
  --json "$out/smollm2_bs32.json" | tail -6
bench --model smollm2-135m --batch 256 --prompt-len 64 --max-tokens 128 --max-batched-tokens 4096 \
  --modes prepare,async,sync --repeats 5 --json "$out/smollm2_bs256.json" | tail -7
bench --model llama-3.2-1b --batch 32 --prompt-len 256 --max-tokens 512 --modes async,sync --repeats 5 \
  --json "$out/llama1b_bs32.json" | tail -5
bench --model llama-3.1-8b --batch 32 --prompt-len 256 --max-tokens 512 --modes "async,sync,hf$extra" --repeats 3 \
  --hf-cb-timeout 150 --json "$out/llama8b_bs32.json" | tail -9
[ "${PROFILE:-0}" = 1 ] && timeout 120 python3 -m bench.kernel_profile --model llama-3.1-8b --random-weights --phase prefill \
  --batch 8 --prompt-len 256 --json "$out/llama8b_prefill_profile.json" | head -14
# The steady decode step's kernel budget (what the 8B target hinges on), and the two decode levers alone.
[ "${PROFILE:-0}" = 1 ] && timeout 120 python3 -m bench.kernel_profile --model llama-3.1-8b --random-weights --phase decode \
  --batch 32 --prompt-len 256 --max-tokens 512 --json "$out/llama8b_decode_profile.json" | head -16
[ "${PROFILE:-0}" = 1 ] && timeout 90 python3 -m bench.decode_attention --json "$out/decode_attention.json" | tail -24
[ "${PROFILE:-0}" = 1 ] && timeout 60 python3 -m bench.decode_gemm --json "$out/decode_gemm.json" | tail -14
for gil in 0.1 2.0; do  # the engine thread's GIL switch interval (default 0.5 ms) against eager launches
  bench --model smollm2-135m --batch 32 --prompt-len 256 --max-tokens 512 --modes async,sync --repeats 3 \
    --gil-switch-ms $gil --json "$out/smollm2_bs32_gil$gil.json" | tail -3
done
