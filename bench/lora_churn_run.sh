#!/usr/bin/env bash
# Adapter churn (issue 44's benchmark) on one H100/H200, in one device call; JSON in $OUT.
#   bash bench/lora_churn_run.sh
# bench/lora_churn.py: 8B shape, random weights, one LoRA engine with 32 slots; one rank-16 adapter on
# all seven modules registered under 500 names (~62 GiB of pinned host images); the same 300-request
# Poisson trace at 6 req/s with 32 resident adapters, then cycling through all 500 (a load for nearly
# every request). Headline: the TTFT p99 the loads add (target <= 50 ms) and the other requests' ITL.
set -u
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout 280 python3 -m bench.lora_churn --out "$out/lora_churn.json" 2>&1 | tail -12
