#!/usr/bin/env bash
# Sampled traffic on the H200, in one device call: the sampler's parts alone, the lockstep engine
# benchmark greedy vs sampled vs logprobs (8B shape and SmolLM2, async and sync), then the realistic
# trace (Poisson ladder, lognormal lengths, the sampling mix vs the same trace greedy). JSON in $OUT.
#   bash bench/h200_sampling_runs.sh [parts]   # parts: any of sampler,lockstep,smollm2,trace (default all)
set -u
out=${OUT:-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
parts=${1:-sampler,lockstep,smollm2,trace}
has() { case ",$parts," in *",$1,"*) return 0 ;; esac; return 1; }
bench() { timeout 420 python3 -m bench.engine_lockstep --random-weights --device cuda "$@"; }
has sampler && timeout 120 python3 -m bench.sampler --json "$out/sampler_parts.json" | tail -8
has lockstep && bench --model llama-3.1-8b --batch 32 --prompt-len 256 --max-tokens 512 --modes async \
  --sampling greedy,sampled,logprobs --repeats 3 --json "$out/llama8b_bs32_sampling.json" | tail -9
has smollm2 && bench --model smollm2-135m --batch 32 --prompt-len 256 --max-tokens 512 --modes async,sync \
  --sampling greedy,sampled --repeats 3 --json "$out/smollm2_bs32_sampling.json" | tail -10
has trace && timeout 480 python3 -m bench.engine_trace --model llama-3.1-8b --random-weights --device cuda \
  --requests 500 --rates inf,20,10 --json "$out/llama8b_trace.json" | tail -10
