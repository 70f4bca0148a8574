#!/usr/bin/env bash
# SLA autoscaling on one H200 (issue 46), one command from the repo root: bench/sla_autoscale_run.py.
#   bash bench/sla_autoscale_run.sh OUTDIR [--max-replicas 3]
# Unpacks .device/pyextra.tar.xz (Ray Serve and friends) where python3 lacks them.
set -euo pipefail
out=${1:?usage: bench/sla_autoscale_run.sh OUTDIR [args]}; shift
mkdir -p "$out"
source "$(dirname "$0")/device_python.sh"
python3 -m bench.sla_autoscale_run --out "$out" "$@" 2>&1 | tee "$out/driver.log" | grep -v "^\s*$" | tail -40
exit "${PIPESTATUS[0]}"
