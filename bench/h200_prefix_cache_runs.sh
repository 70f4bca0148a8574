#!/usr/bin/env bash
# Prefix caching (issue 25) on the lent H200, from the repo root: the GPU tests (caching on against
# off through decode and mixed-step graphs, chunking, preemption, n > 1), the engine's GPU tests
# (every engine now caches by default: a warm-up request's prompt is found again), then the benchmark: 50 tenants' 5-turn
# conversations on the 8B shape, caching on then off (targets: TTFT p50 >= 4x lower at the rate,
# output tok/s >= 1.5x at saturation, >= 90% of cacheable prompt tokens hit).
#
#   bash bench/h200_prefix_cache_runs.sh "$OUT" tests    # one device call (under 10 minutes)
#   bash bench/h200_prefix_cache_runs.sh "$OUT" engine   # another
#   bash bench/h200_prefix_cache_runs.sh "$OUT" bench   # another (about 8 minutes: CONVERSATIONS=30 for less)
set -uo pipefail
out=${1:?usage: bench/h200_prefix_cache_runs.sh OUTDIR [tests,engine,bench]}
parts=${2:-tests,engine,bench}
has() { case ",$parts," in *",$1,"*) return 0 ;; esac; return 1; }
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
has tests && timeout 560 python3 -m pytest tests/gpu/test_prefix_cache_gpu.py \
  -q --confcutdir=tests/gpu -p no:cacheprovider 2>&1 | tail -15 | tee "$out/tests_gpu_prefix_cache.log"
has engine && timeout 560 python3 -m pytest tests/gpu/test_gpu_engine.py \
  -q --confcutdir=tests/gpu -p no:cacheprovider 2>&1 | tail -15 | tee "$out/tests_gpu_engine.log"
has bench && timeout 580 python3 -m bench.prefix_cache --model llama-3.1-8b --random-weights --device cuda \
  --conversations "${CONVERSATIONS:-50}" --rate "${RATE:-1.0}" --json "$out/h200_llama-3.1-8b_prefix_cache.json" \
  2>&1 | tail -6
