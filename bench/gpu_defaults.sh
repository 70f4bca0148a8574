#!/usr/bin/env bash
# Issue 49 on the lent GPU machine, in one command from the repo root: a new user's defaults
# (`fairlane serve` with a config naming only the model) beside loadtest/configs/gpu-8b.yaml, both
# serving an 8B-shaped checkpoint directory written in the run, on the same seeded traces.
#
#   bash bench/gpu_defaults.sh "$OUT"                       # one H200 (~7 min)
#   bash bench/gpu_defaults.sh "$OUT" --variants sized,defaults,slots-256
#   bash bench/gpu_defaults.sh OUTDIR --smoke               # SmolLM2's shape on the CPU (~4 min)
#
# OUTDIR gets results.json, table.txt and logs.txt; driver.log is everything printed.
set -euo pipefail
out=${1:?usage: bench/gpu_defaults.sh OUTDIR [--smoke] [--variants a,b] [--budget-s S]}; shift
mkdir -p "$out"
source "$(dirname "$0")/device_python.sh"
python3 -m bench.gpu_defaults --out "$out" "$@" 2>&1 | tee "$out/driver.log"
exit "${PIPESTATUS[0]}"
