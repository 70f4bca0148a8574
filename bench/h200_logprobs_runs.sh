#!/usr/bin/env bash
# Logprobs at full speed (issue 42) on the H200, one part per device call; JSON in $OUT.
#   bash bench/h200_logprobs_runs.sh tests    # tests/gpu/test_gpu_sampling.py, then the trace after
#   bash bench/h200_logprobs_runs.sh before   # the same trace on .device/before_replica.tar's engine
#   bash bench/h200_logprobs_runs.sh cluster  # one replica's capacity, the load generator's mix vs greedy
# The trace: 8B shape, random weights, 400 requests, all at once and Poisson at 20 req/s, the new
# sampling mix (logprobs on a fifth of sampled requests, n=2 and JSON schemas on 5% each) beside the
# same trace greedy and greedy asking the top 20 logprobs (bench/engine_trace.py).
set -u
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
repo=$PWD
source bench/device_python.sh  # llguidance (JSON schemas) and the cluster's packages: .device/pyextra.tar.xz
# The schemas' grammars need a tokenizer: bench/bpe_vocab.py's, the same file before and after.
bpe=$HOME/.cache/fairlane/bench/bpe-128256.json
[ -s "$bpe" ] || { mkdir -p "$(dirname "$bpe")" && xz -dc .device/bpe-128256.json.xz > "$bpe"; }
trace() {  # trace SECONDS MIXES JSON: from the current directory's `replica`, the repo's bench
  timeout "$1" python3 -m bench.engine_trace --model llama-3.1-8b --random-weights --device cuda \
    --requests 400 --rates inf,20 --mixes "$2" --json "$3" 2>&1 | grep -v "^\[trace\] loaded" | tail -9
}
case ${1:-tests} in
tests)
  [ -n "${SKIP_TESTS:-}" ] || timeout 240 python3 -m pytest -q -x tests/gpu/test_gpu_sampling.py \
    --confcutdir=tests/gpu 2>&1 | tail -2
  trace 300 greedy,mixed,logprobs20 "$out/trace_after.json" ;;
before)  # `replica` from the base commit: run from a folder that holds only it (first on sys.path)
  mkdir -p /tmp/before && tar xf .device/before_replica.tar -C /tmp/before
  cd /tmp/before && PYTHONPATH=/tmp/before:$PYTHONPATH trace 280 greedy,mixed,logprobs20 "$out/trace_before.json" ;;
cluster)
  # Random weights serve through the synthetic word tokenizer, which cannot constrain output: the
  # mix runs without its JSON schemas (the same draws otherwise); the engine trace has them.
  for s in mix_without_schemas greedy; do
    sed "s/^seed: 4\$/seed: 4\nsampling: $s/" loadtest/scenarios/steady-long.yaml > /tmp/steady-long-$s.yaml
    grep -q "^sampling: $s" /tmp/steady-long-$s.yaml || { echo "no $s scenario"; exit 1; }
  done
  sweep=(--replicas 1 --scenarios "" --start-tps 6000 --factor 1.25 --rung-s 20 --rung-drain-s 8
         --rung-warmup-fraction 0.3 --rung-throughput window --engine-estimate-tps 11473.7 --budget-s 265)
  bash bench/cluster_run.sh "$out/mix" --sweep-scenario /tmp/steady-long-mix_without_schemas.yaml "${sweep[@]}" \
    2>&1 | grep -E "rung|capacity" | tail -8
  bash bench/cluster_run.sh "$out/greedy" --sweep-scenario /tmp/steady-long-greedy.yaml "${sweep[@]}" \
    2>&1 | grep -E "rung|capacity" | tail -8
  ;;
esac
