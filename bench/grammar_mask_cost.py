"""Per-token cost of a grammar's token mask, for the three maintained libraries, on this CPU.

Structured output fills one packed bitmask (int32 words) per constrained sequence per step on the
host, while the device runs the previous step: that fill must stay well under a decode step. This
measures it as the engine would pay it: a batch of matchers walks a typical JSON schema's answer
token by token; at each token every matcher fills its row of one [batch, vocab / 32] int32 mask,
then accepts the token. Reported per library and vocabulary: grammar compile time (cold, and what
the tokenizer setup costs once), and fill time per token per sequence (mean, p50, p99), one thread
and, where the library has one, its batch fill on a thread pool; the accept time; the same for
`json_object` (any JSON object). Each allowed set is checked: the answer's next token must be in it.
Every library gets the engine's whitespace rule: at most MAX_WHITESPACE characters per gap.

    python -m bench.grammar_mask_cost --json docs/bench/cpu_grammar_mask_cost.json

Vocabularies: SmolLM2's (49,152, when its converted cache is here) and a byte-level BPE of Llama 3's
128,256 ids trained on the standard library (bench/bpe_vocab.py; no Llama 3 tokenizer is reachable).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.bpe_vocab import hf_tokenizer
from replica.grammar_compiler import JSON_OPTIONS, MAX_WHITESPACE

# A typical extraction schema: nested object, array, enum, bounded integer, number, boolean, pattern.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "email", "role", "active", "score", "tags", "address"],
    "additionalProperties": False,
}
ANSWER = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@analytical.engine",
    "role": "editor",
    "active": True,
    "score": 98.5,
    "tags": ["mathematics", "poetry", "computing"],
    "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"},
}
OBJECT_SCHEMA = {"type": "object"}  # json_object: any JSON object


@dataclass
class Vocab:
    name: str
    hf: object  # transformers PreTrainedTokenizerFast
    size: int
    eos: int


def smollm2_vocab() -> Vocab | None:
    from replica.embedded_model import cache_root

    path = cache_root() / "smollm2-135m"
    if not (path / "tokenizer.json").exists():
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return Vocab("smollm2-49152", tok, len(tok), tok.eos_token_id)


def bpe_vocab(size: int) -> Vocab:
    tok = hf_tokenizer(size)
    return Vocab(f"bpe-{size}", tok, max(size, len(tok)), tok.eos_token_id)


# ---- one adapter per library: setup(vocab) -> compile(schema) -> matcher; fill rows; accept -------
class Xgrammar:
    name = "xgrammar"

    def __init__(self, vocab: Vocab) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(vocab.hf, vocab_size=vocab.size, stop_token_ids=[vocab.eos])
        self.compiler = xgr.GrammarCompiler(info, max_threads=os.cpu_count() or 1, cache_enabled=False)
        self.batch = xgr.BatchGrammarMatcher(max_threads=os.cpu_count() or 1)

    def compile(self, schema: dict):
        strict = schema != OBJECT_SCHEMA  # json_object: any properties
        return self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=True, max_whitespace_cnt=MAX_WHITESPACE, strict_mode=strict
        )

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher, mask: np.ndarray, row: int) -> None:
        import torch

        matcher.fill_next_token_bitmask(torch.from_numpy(mask), row)

    def fill_batch(self, matchers: list, mask: np.ndarray) -> None:
        import torch

        self.batch.batch_fill_next_token_bitmask(matchers, torch.from_numpy(mask))

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)


class Llguidance:
    name = "llguidance"

    def __init__(self, vocab: Vocab) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self.llg = llguidance
        self.np = llguidance.numpy
        self.tokenizer = llguidance.hf.from_tokenizer(vocab.hf, n_vocab=vocab.size)
        self.executor = llguidance.LLExecutor(num_threads=os.cpu_count() or 1)

    def compile(self, schema: dict):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)  # builds the lexer: the compile step
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return (grammar, matcher)

    def matcher(self, compiled):
        return compiled[1].deep_copy()

    def fill(self, matcher, mask: np.ndarray, row: int) -> None:
        self.np.fill_next_token_bitmask(matcher, mask, row)

    def fill_batch(self, matchers: list, mask: np.ndarray) -> None:
        self.np.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], mask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)


class OutlinesCore:
    """Regular languages only: a schema becomes a regex and the index precomputes every state's
    allowed tokens at compile time. `json_object` (recursive) has no regex: not measured."""

    name = "outlines-core"

    def __init__(self, vocab: Vocab) -> None:
        import outlines_core as oc

        self.oc = oc
        self.size = vocab.size
        byte_tokens = _token_bytes(vocab.hf)
        mapping: dict[bytes, list[int]] = {}
        for token_id, raw in byte_tokens.items():
            if token_id != vocab.eos and raw:
                mapping.setdefault(raw, []).append(token_id)
        self.vocabulary = oc.Vocabulary(vocab.eos, mapping)

    def compile(self, schema: dict):
        if schema == OBJECT_SCHEMA:
            raise NotImplementedError("recursive: no regex")
        whitespace = rf"[\n\t ]{{0,{MAX_WHITESPACE}}}"
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), whitespace)
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled):
        return self.oc.Guide(compiled)

    def fill(self, matcher, mask: np.ndarray, row: int) -> None:
        view = mask[row]
        matcher.write_mask_into(view.ctypes.data, view.size, 4)

    fill_batch = None

    def accept(self, matcher, token: int) -> bool:
        matcher.advance(token)
        return True


def _token_bytes(hf) -> dict[int, bytes]:
    """Each id's bytes under a byte-level BPE (GPT-2's byte alphabet undone)."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    table = {ch: b for b, ch in _byte_unicode().items() if ch in alphabet}
    out = {}
    for token, token_id in hf.get_vocab().items():
        if all(ch in table for ch in token):
            out[token_id] = bytes(table[ch] for ch in token)
        else:
            out[token_id] = token.encode()
    return out


def _byte_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


# ---- the walk --------------------------------------------------------------------------------------
def allowed(mask_row: np.ndarray, token: int) -> bool:
    return bool((int(mask_row[token // 32]) >> (token % 32)) & 1)


def walk(lib, compiled, tokens: list[int], eos: int, batch: int, fill: Callable | None) -> dict:
    """Every matcher walks `tokens`; returns per-token-per-sequence fill and accept times (µs)."""
    matchers = [lib.matcher(compiled) for _ in range(batch)]
    words = -(-lib_vocab(lib) // 32)
    mask = np.zeros((batch, words), dtype=np.int32)
    fills, accepts = [], []
    for token in [*tokens, eos]:
        mask.fill(0)
        t0 = time.perf_counter()
        if fill is None:
            for row, m in enumerate(matchers):
                lib.fill(m, mask, row)
        else:
            fill(matchers, mask)
        t1 = time.perf_counter()
        fills.append((t1 - t0) / batch * 1e6)
        if not all(allowed(mask[row], token) for row in range(batch)):
            raise AssertionError(f"{lib.name}: token {token} not allowed at step {len(fills)}")
        if token == eos:
            break
        t2 = time.perf_counter()
        for m in matchers:
            if not lib.accept(m, token):
                raise AssertionError(f"{lib.name}: token {token} refused")
        accepts.append((time.perf_counter() - t2) / batch * 1e6)
    return {"fill_us": _stats(fills), "accept_us": _stats(accepts), "tokens": len(fills)}


def lib_vocab(lib) -> int:
    return lib.vocab_size


def _stats(values: list[float]) -> dict:
    a = np.asarray(values)
    return {"mean": round(float(a.mean()), 2), "p50": round(float(np.percentile(a, 50)), 2),
            "p99": round(float(np.percentile(a, 99)), 2), "max": round(float(a.max()), 2)}  # fmt: skip


def best_walk(lib, compiled, tokens, eos, batch, fill, repeats: int) -> dict:
    """The walk `repeats` times, the run with the lowest mean fill kept (the machine is shared: the
    others' load only adds), with every run's mean beside it."""
    runs = [walk(lib, compiled, tokens, eos, batch, fill) for _ in range(repeats)]
    best = min(runs, key=lambda r: r["fill_us"]["mean"])
    return {**best, "fill_us_mean_of_each_run": [r["fill_us"]["mean"] for r in runs]}


def measure(lib_cls, vocab: Vocab, batches: list[int], repeats: int) -> dict:
    t0 = time.perf_counter()
    lib = lib_cls(vocab)
    lib.vocab_size = vocab.size
    result: dict = {"setup_s": round(time.perf_counter() - t0, 3)}
    answer_ids = vocab.hf.encode(json.dumps(ANSWER), add_special_tokens=False)
    object_ids = vocab.hf.encode(
        json.dumps({"result": ANSWER, "ok": [1, 2.5, None]}), add_special_tokens=False
    )
    for label, schema, ids in (
        ("json_schema", SCHEMA, answer_ids),
        ("json_object", OBJECT_SCHEMA, object_ids),
    ):
        try:
            t0 = time.perf_counter()
            compiled = lib.compile(schema)
            compile_s = time.perf_counter() - t0
        except NotImplementedError as exc:
            result[label] = {"skipped": str(exc)}
            continue
        entry: dict = {"compile_s": round(compile_s, 3), "answer_tokens": len(ids)}
        for batch in batches:
            walk_args = (lib, compiled, ids, vocab.eos, batch)
            entry[f"batch{batch}_serial"] = best_walk(*walk_args, None, repeats)
            if lib.fill_batch is not None and batch > 1:
                entry[f"batch{batch}_parallel"] = best_walk(*walk_args, lib.fill_batch, repeats)
        result[label] = entry
    return result


LIBS = {"xgrammar": Xgrammar, "llguidance": Llguidance, "outlines-core": OutlinesCore}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--libs", default=",".join(LIBS))
    parser.add_argument("--vocabs", default="bpe-128256,smollm2")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    vocabs = []
    for name in args.vocabs.split(","):
        if name.startswith("bpe-"):
            vocabs.append(bpe_vocab(int(name.removeprefix("bpe-"))))
        elif (v := smollm2_vocab()) is not None:
            vocabs.append(v)
    report: dict = {
        "what": "host time to fill one constrained sequence's next-token bitmask, per token, walking a "
        "typical JSON schema's answer (bench/grammar_mask_cost.py)",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
        },
        "versions": {},
        "schema": SCHEMA,
        "answer": ANSWER,
        "results": {},
    }
    for name in args.libs.split(","):
        dist = {"outlines-core": "outlines_core"}.get(name, name)
        report["versions"][name] = importlib.metadata.version(dist)
        for vocab in vocabs:
            print(f"{name} on {vocab.name} ({vocab.size} ids)...", flush=True)
            entry = measure(LIBS[name], vocab, batches, args.repeats)
            report["results"].setdefault(vocab.name, {})[name] = entry
            print(json.dumps(entry, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
