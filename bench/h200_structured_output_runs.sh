#!/usr/bin/env bash
# Structured output (issue 21) on the lent H200, from the repo root: the GPU tests of the device
# path (the mask kernel, graphs with constrained rows, no host syncs; the sampler's tests beside
# them, since its noise changed at the top hash), then the benchmark: the same trace with a JSON
# schema on every request and without, on the 8B shape (target ratio >= 0.9).
#
#   bash bench/h200_structured_output_runs.sh "$OUT" tests   # one device call (under 10 minutes)
#   bash bench/h200_structured_output_runs.sh "$OUT" bench   # another
#
# The GPU machine reaches no package index: without llguidance it installs the wheel from .whl/
# (`pip download llguidance==1.9.1 --only-binary=:all: --no-deps -d .whl` on a machine that can).
set -uo pipefail
out=${1:?usage: bench/h200_structured_output_runs.sh OUTDIR [tests,bench]}
parts=${2:-tests,bench}
has() { case ",$parts," in *",$1,"*) return 0 ;; esac; return 1; }
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c "import llguidance" 2>/dev/null || pip install -q --no-index --find-links .whl llguidance==1.9.1
has tests && timeout 480 python3 -m pytest tests/gpu/test_structured_output_gpu.py tests/gpu/test_gpu_sampling.py \
  -q --confcutdir=tests/gpu -p no:cacheprovider 2>&1 | tail -15 | tee "$out/tests_gpu_structured_output.log"
has bench && timeout 560 python3 -m bench.structured_output --model llama-3.1-8b --random-weights --device cuda \
  --requests "${REQUESTS:-256}" --rates "${RATES:-inf,20}" --json "$out/h200_llama-3.1-8b_structured_output.json" \
  2>&1 | tail -6
