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
# Only where this python lacks the packages (the GPU image): a box with its own venv keeps it.
if ! python3 -c 'import ray.serve, fastapi, pydantic, typer, httpx' 2>/dev/null; then
  if [ ! -d /tmp/pyextra/ray ]; then
    [ -s .device/pyextra.tar.xz ] || { echo "no Ray here and no .device/pyextra.tar.xz to unpack" >&2; exit 2; }
    mkdir -p /tmp/pyextra && tar xJf .device/pyextra.tar.xz -C /tmp/pyextra --strip-components=1
  fi
  export PYTHONPATH=/tmp/pyextra:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/pyextra/bin:$PATH
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true  # thousands of streams at once
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
python3 -m bench.cluster_run --out "$out" "$@" 2>&1 | tee "$out/driver.log"
exit "${PIPESTATUS[0]}"
