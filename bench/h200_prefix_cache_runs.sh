#!/usr/bin/env bash
# Prefix caching (issue 25) on the lent H200, from the repo root: the GPU tests (caching on against
# off through decode and mixed-step graphs, chunking, preemption, n > 1), the engine's GPU tests
# (every engine now caches by default: a warm-up request's prompt is found again), then the benchmark
# (issue 25's workload): 50 tenants' 5-turn sampled conversations on the 8B shape, caching off then on,
# each engine at saturation then with Poisson conversation starts at 80% of the cache-off engine's
# saturation capacity (targets: TTFT p50 >= 4x lower at that rate, output tok/s >= 1.5x at
# saturation, >= 90% of cacheable prompt tokens hit); TTFT, TPOT and ITL p50/p99 per run.
# NO_CONTEXT_GRAPHS=1: the engines run steps whose chunks continue their sequences eagerly (context_cuda_graphs
# off; on by default).
#
#   bash bench/h200_prefix_cache_runs.sh "$OUT" tests    # one device call (under 10 minutes)
#   bash bench/h200_prefix_cache_runs.sh "$OUT" engine   # another
#   bash bench/h200_prefix_cache_runs.sh "$OUT" bench    # another (about 4-8 minutes; CONVERSATIONS=30 for less,
#                                                        # RATE=1.0 for a fixed rate instead of RATE_FRACTION=0.8)
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
if [ -n "${RATE:-}" ]; then rate=(--rate "$RATE"); else rate=(--rate-fraction "${RATE_FRACTION:-0.8}"); fi
has bench && timeout 580 python3 -m bench.prefix_cache --model llama-3.1-8b --random-weights --device cuda \
  --conversations "${CONVERSATIONS:-50}" "${rate[@]}" ${NO_CONTEXT_GRAPHS:+--no-context-graphs} --json "$out/h200_llama-3.1-8b_prefix_cache.json" \
  2>&1 | tee "$out/prefix_cache.log" | tail -8
