#!/usr/bin/env bash
# Issue 20 on the lent H200, from the repo root: an 8B-shaped checkpoint directory written with
# save_pretrained in the run (the GPU machine has no hub), then the realistic trace served from
# that directory like a downloaded model, its load time beside it.
#
#   bash bench/h200_checkpoint_runs.sh "$OUT"
set -euo pipefail
out=${1:?usage: bench/h200_checkpoint_runs.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
ckpt=${CKPT_DIR:-/tmp/llama-3.1-8b-shaped}
# write_checkpoint prints its own JSON line: bytes written and seconds
python3 -m bench.write_checkpoint --shape llama-3.1-8b --out "$ckpt" --dtype bfloat16 2>&1 | tail -3 | tee "$out/write_time.txt"
ls "$ckpt" | tee -a "$out/write_time.txt"
python3 -m bench.engine_trace --model "$ckpt" --device cuda --requests "${REQUESTS:-300}" --rates inf,20 \
  --json "$out/h200_llama-3.1-8b_dir_trace.json" 2>&1 | grep -v "^\[trace\] .*tok/s" | tail -12
