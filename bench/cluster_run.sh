#!/usr/bin/env bash
# The GPU cluster benchmark (issue 8) on the lent GPU machine, in one command from the repo root:
#
#   bash bench/cluster_run.sh "$OUT"            # Llama-3.1-8B shape, one H200 (~7 min)
#   bash bench/cluster_run.sh OUTDIR --smoke    # SmolLM2 random weights on the CPU (~5 min)
#   bash bench/cluster_run.sh "$OUT" --replicas 1,2 --engine-estimate-tps 9011.6 --budget-s 330
#                                                         # two H200s: 1 then 2 replicas (~5.5 min)
#
# Unpacks .device/pyextra.tar.xz (Ray Serve and the cluster's other packages; made by
# ../shared/tools/pack-python-for-device.sh) when python3 lacks them and it is not unpacked yet, then runs
# `python3 -m bench.cluster_run` (the package is not pip-installed there). OUTDIR gets
# results.json, table.txt, logs.txt and runs.tar.gz; driver.log is everything printed.
set -euo pipefail
out=${1:?usage: bench/cluster_run.sh OUTDIR [--smoke] [--budget-s S] [--config APP.yaml] [--replicas 1,2] [--engine-estimate-tps X]}; shift
mkdir -p "$out"
source "$(dirname "$0")/device_python.sh"
python3 -m bench.cluster_run --out "$out" "$@" 2>&1 | tee "$out/driver.log"
exit "${PIPESTATUS[0]}"
