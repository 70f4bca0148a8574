#!/usr/bin/env bash
# Where a sampling mix's steps lose the device (issue 42), on the GPU machine, one call:
#   OUT=DIR [TRACE_ARGS=...] bash bench/h200_trace_profile.sh [MIXES] [PYSPY_RUN]
# The 8B trace (random weights, 400 requests all at once, bench/engine_trace.py) for MIXES (default
# greedy,mixed,mixed_noschema,logprobs20), every step's record in $OUT/step_records.json, the
# summary in $OUT/trace.json; py-spy samples the engine's process through run PYSPY_RUN (default
# mixed@inf; "none": no sampling) into $OUT/pyspy_<run>.txt when .device holds a py-spy wheel.
# TRACE_ARGS go to the trace (--no-prepare-grammars: the first schema builds the tokenizer view, as
# before engines built it at start). A gap table comes last.
set -u
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
mixes=${1:-greedy,mixed,mixed_noschema,logprobs20}
spy_run=${2:-mixed@inf}
source bench/device_python.sh  # llguidance (the schemas) and the mix's packages: .device/pyextra.tar.xz
bpe=$HOME/.cache/fairlane/bench/bpe-128256.json
[ -s "$bpe" ] || { mkdir -p "$(dirname "$bpe")" && xz -dc .device/bpe-128256.json.xz > "$bpe"; }
spy=""
if ls .device/py_spy-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .device/py_spy-*.whl && spy=/tmp/pyspy/bin/py-spy
fi
log=$out/trace.log
timeout 420 python3 -m bench.engine_trace --model llama-3.1-8b --random-weights --device cuda \
  --requests 400 --rates inf --mixes "$mixes" --json "$out/trace.json" \
  --step-records "$out/step_records.json" ${TRACE_ARGS:-} > "$log" 2>&1 &
pid=$!
if [ -n "$spy" ] && [ "$spy_run" != none ]; then  # start sampling as the run before PYSPY_RUN ends
  before=$(python3 -c "import sys; m=sys.argv[1].split(','); r=sys.argv[2].split('@')[0]; \
print(m[m.index(r)-1] + '@inf' if r in m and m.index(r) else 'loaded')" "$mixes" "$spy_run")
  until grep -q "\] $before" "$log" || ! kill -0 $pid 2>/dev/null; do sleep 0.2; done
  py=$(pgrep -P $pid | head -1)  # the engine's python, under timeout
  [ -n "$py" ] && timeout 60 "$spy" record -p "$py" --threads --idle --nonblocking -r 250 \
    -d 12 -f raw -o "$out/pyspy_${spy_run/@/_}.txt" > /dev/null 2>&1
fi
wait $pid
grep -v "^\[trace\] loaded" "$log" | tail -12
python3 -m bench.step_gaps "$out/step_records.json"
