#!/usr/bin/env bash
# fcfs, vtc and fairlane on the same seeded traces (issue 23) on the lent GPU machine, in one
# command from the repo root:
#
#   bash bench/policy_run.sh "$OUT"                       # Llama-3.1-8B shape, one H200 (<= 9 min)
#   bash bench/policy_run.sh OUTDIR --smoke               # SmolLM2 random weights on the CPU
#   bash bench/policy_run.sh "$OUT" --capacity-tps 13839 --budget-s 540 --duration-s 20
#
# Each run's load is drained to its last request (loadtest/drain.py); the phases are fitted to
# --budget-s first (bench/policy_schedule.py) and what does not fit is skipped and said: in
# results.json's "skipped" and the table's "skipped" rows.
#
# Unpacks .device/pyextra.tar.xz (Ray Serve and the cluster's other packages; made by
# ../shared/tools/pack-python-for-device.sh) when python3 lacks them and it is not unpacked yet, then runs
# `python3 -m bench.policy_run` (the package is not pip-installed there). OUTDIR gets
# results.json, table.txt, logs.txt and runs.tar.gz; driver.log is everything printed.
set -euo pipefail
out=${1:?usage: bench/policy_run.sh OUTDIR [--smoke] [--capacity-tps X] [--budget-s S] [--policies a,b] [--scenarios a,b] [--duration-s D]}; shift
mkdir -p "$out"
source "$(dirname "$0")/device_python.sh"
python3 -m bench.policy_run --out "$out" "$@" 2>&1 | tee "$out/driver.log"
exit "${PIPESTATUS[0]}"
