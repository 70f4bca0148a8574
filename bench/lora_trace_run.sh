#!/usr/bin/env bash
# Multi-LoRA under realistic traffic (issue 44's benchmark) on one H100/H200, in one device call; JSON in $OUT.
#   bash bench/lora_trace_run.sh
# bench/lora_trace.py: 8B shape, random weights, rank-16 adapters on all seven modules; the base engine
# (LoRA off) against one LoRA engine (64 slots) with 1, 8 and 64 distinct adapters, 200 requests of the
# sampled mix at 20 req/s (Poisson) and all at once; adapter load disk -> host -> device. ~5 min.
set -u
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout 580 python3 -m bench.lora_trace --out "$out/lora_trace.json" 2>&1 | tail -16
