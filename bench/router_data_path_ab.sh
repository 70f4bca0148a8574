#!/usr/bin/env bash
# One router's data path at a base commit and at the working tree, in one call on the same machine:
#   bash bench/router_data_path_ab.sh OUT_DIR [BASE_COMMIT]     (BASE_COMMIT defaults to HEAD)
# Runs, in order: "before" (the base's product and bench), "before_new_standin" (the base's product
# with this tree's stand-in replica, bench/step_replica.py) and "after" (this tree). Each writes
# OUT_DIR/<name>.json; a table of the three comes last. Carry .device where Ray is not installed.
set -euo pipefail
out=$(realpath -m "$1")
base=${2:-HEAD}
here=$PWD
mkdir -p "$out"
source bench/device_python.sh
# The 2026-12-06 status run's arguments (BENCHMARKS.md); RDP_ARGS replaces them (a CPU check).
read -r -a args <<< "${RDP_ARGS:---streams 512 --stream-tokens 512 --short-clients 256 --short-tokens 2 \
--tpot-ms 10 --replicas 4 --duration 15 --warmup 5 --client-procs 8 --model llama-3.1-8b --direct-ingress \
--set direct_dispatch=true}"
extra=""
[ -d /tmp/pyextra/ray ] && extra=:/tmp/pyextra

tree=$(mktemp -d)
git archive "$base" | tar -x -C "$tree"
run_in() {  # run_in DIR NAME: the bench from DIR's code
  local dir=$1 name=$2
  echo "== $name ($dir)"
  (cd "$dir" && PYTHONPATH="$dir$extra" python3 -m bench.router_data_path \
      --out "$out/$name.json" --label "$name" "${args[@]}" 2>&1 | tail -4)
  ray stop --force >/dev/null 2>&1 || true
}
runs=${RDP_RUNS:-before before_new_standin after}  # a subset: RDP_RUNS="before after"
[[ " $runs " == *" before "* ]] && run_in "$tree" before
cp bench/step_replica.py "$tree/bench/step_replica.py"
[[ " $runs " == *" before_new_standin "* ]] && run_in "$tree" before_new_standin
[[ " $runs " == *" after "* ]] && run_in "$here" after

python3 - "$out" <<'EOF'
import json, sys
from pathlib import Path
print("run                  stream CPU ms  tok/s   outputs/token  gap p50/p99 ms  late p99  short req/s  short CPU ms")
for name in ("before", "before_new_standin", "after"):
    if not (Path(sys.argv[1]) / f"{name}.json").exists():
        continue
    d = json.loads((Path(sys.argv[1]) / f"{name}.json").read_text())
    s, q = d["phases"]["streams"], d["phases"]["short"]
    span = d["args"]["duration"] + d["args"]["warmup"]  # the channel's count includes the warm-up
    per_token = s["stream_channel"]["outputs"] / max(1.0, s["tokens_per_s"] * span)
    print(f"{name:<20} {s['router_plus_proxy_cpu_ms_per_request']:13.2f}  {s['tokens_per_s']:6.0f}"
          f"  {per_token:13.2f}  {s['event_gap_ms']['p50']:6.1f}/{s['event_gap_ms']['p99']:6.1f}"
          f"  {s['token_lateness_ms']['p99']:8.1f}  {q['ok_rps']:11.1f}  {q['router_plus_proxy_cpu_ms_per_request']:12.2f}")
EOF
