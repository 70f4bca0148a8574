"""Prompt text and output lengths for planned requests, drawn from a seeded generator."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

from loadtest.scenario import BundledPrompts, FixedLength, OutputLength, PromptLength, UniformLength

BUNDLED_PROMPTS = Path(__file__).parent / "data" / "chat_prompts.jsonl"
# Short common English words: each is one token in Llama-family tokenizers, so a synthetic
# prompt of N words is close to N prompt tokens (the server's usage gives the exact count).
FILLER_WORDS = (
    "the",
    "time",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "world",
    "life",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "work",
    "point",
    "home",
    "water",
    "room",
    "fact",
    "book",
    "word",
)


@cache
def bundled_prompts() -> tuple[str, ...]:
    lines = BUNDLED_PROMPTS.read_text(encoding="utf-8").splitlines()
    return tuple(json.loads(line)["prompt"] for line in lines if line.strip())


def draw_length(spec: FixedLength | UniformLength, rng: np.random.Generator) -> int:
    if isinstance(spec, FixedLength):
        return spec.tokens
    return int(rng.integers(spec.min, spec.max + 1))


def synthetic_prompt(words: int, rng: np.random.Generator) -> str:
    picks = rng.integers(0, len(FILLER_WORDS), size=words)
    return " ".join(FILLER_WORDS[i] for i in picks)


def draw_prompt(spec: PromptLength, rng: np.random.Generator) -> str:
    if isinstance(spec, BundledPrompts):
        pool = bundled_prompts()
        if spec.max_words is not None:
            pool = tuple(p for p in pool if len(p.split()) <= spec.max_words) or pool
        return pool[int(rng.integers(0, len(pool)))]
    return synthetic_prompt(draw_length(spec, rng), rng)


def draw_output(spec: OutputLength, rng: np.random.Generator) -> int:
    return draw_length(spec, rng)
