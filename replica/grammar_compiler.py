"""Grammars for structured output, with llguidance: compile once per schema, one matcher per sequence.

The one module of the engine that imports the grammar library, and only on the compile thread when
a request first asks for a response format, so a replica without the library serves plain
requests. Why llguidance: of the three maintained libraries it filled a 128,256-id token mask for a
batch of 32 sequences in the fewest microseconds per row, for a JSON schema and for any JSON object
(docs/engine.md, "Structured output"; docs/bench/cpu_grammar_mask_cost.json). It also imports no
torch, so the router checks schemas with it too (cluster/edge/response_format.py).

- The tokenizer's view (every id's bytes, the model's vocabulary size, the EOS ids) is built once,
  on the compile thread, the first time it is needed (about a second for 128k ids).
- Compiling runs on a thread of its own, never on the engine's step loop or an event loop; results
  are kept in an LRU keyed by the spec (compact JSON), so a repeated schema compiles once. A
  schema the library refuses fails its future with InvalidRequestError (HTTP 400). A compiled
  grammar is a matcher at its start; each sequence gets a copy.
- Whitespace between JSON tokens is bounded (at most MAX_WHITESPACE characters per gap): a model may
  pretty-print, but it cannot fill its answer with spaces and never close the object.
- Masks of a step's constrained rows are filled on llguidance's thread pool, in one call that drops
  the interpreter lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from replica.errors import InvalidRequestError
from replica.grammar_spec import GrammarSpec

CACHE_SIZE = 128  # compiled grammars kept (a compiled JSON schema is tens of KB to a few MB)
MAX_WHITESPACE = 8  # characters in one gap between JSON tokens (pretty-printing to depth 3)
JSON_OPTIONS = {
    "whitespace_flexible": True,
    "whitespace_pattern": rf"[\x20\x0A\x0D\x09]{{1,{MAX_WHITESPACE}}}",
}


class GrammarCompiler:
    """One per engine: the tokenizer's view, the compile thread, the LRU and the fill pool."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], threads: int = 0) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_ids = list(eos_ids)
        # Mask fills run while the engine thread waits (the interpreter lock dropped): llguidance's
        # default pool, 80% of the cores up to 32, unless told.
        self._threads = threads or None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairlane-grammar")
        self._lock = threading.Lock()
        self._cache: OrderedDict[GrammarSpec, Future] = OrderedDict()
        self._ll_tokenizer = None  # built on the compile thread
        self._executor = None  # llguidance's fill pool, built with it
        self.compiles = 0  # grammars compiled (cache misses)
        self.rows_filled = 0  # mask rows filled, and the host seconds they took (benchmarks read them)
        self.fill_seconds = 0.0
        self.advance_seconds = 0.0  # host seconds the engine spent feeding drawn tokens to matchers

    @property
    def words(self) -> int:
        """int32 words in one row of the packed mask."""
        return -(-self._vocab_size // 32)

    def compile(self, spec: GrammarSpec) -> Future:
        """The compiled grammar of `spec` (a future: wait for it off the event loop, e.g. with
        asyncio.wrap_future). Misses run on the compile thread, in arrival order."""
        with self._lock:
            future = self._cache.get(spec)
            if future is not None:
                self._cache.move_to_end(spec)
                return future
            future = self._pool.submit(self._compile, spec)
            self._cache[spec] = future
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return future

    def prepare(self) -> Future:
        """The tokenizer's view built on the compile thread (a future), ahead of any grammar."""
        return self._pool.submit(self._ensure_tokenizer)

    def _compile(self, spec: GrammarSpec):
        self.compiles += 1
        tokenizer = self._ensure_tokenizer()
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(spec.schema, defaults=JSON_OPTIONS)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            error = matcher.get_error()
            raise InvalidRequestError(f"response_format: the JSON schema cannot be compiled: {error}")
        return matcher

    def _ensure_tokenizer(self):
        if self._ll_tokenizer is None:
            try:  # imported here, on the compile thread
                import llguidance
                import llguidance.hf
            except ImportError:
                raise InvalidRequestError("response_format needs the llguidance package here") from None
            if self._tokenizer is None:
                raise InvalidRequestError("response_format needs the model's tokenizer; this model has none")
            try:
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self._tokenizer, n_vocab=self._vocab_size, eos_token=self._eos_ids
                )
            except (ValueError, TypeError) as exc:  # e.g. a word-level tokenizer: no bytes per id
                message = f"response_format: this model's tokenizer cannot be used: {exc}"
                raise InvalidRequestError(message) from None
            self._executor = llguidance.LLExecutor(num_threads=self._threads)
        return self._ll_tokenizer

    def matcher(self, compiled) -> Any:
        """A fresh matcher at the grammar's start (one per sequence; n > 1 gets one per sample)."""
        return compiled.deep_copy()

    def fill(self, rows: list[tuple[Any, int]], mask: np.ndarray) -> None:
        """For each (matcher, k) of `rows`, row k of `mask` (int32, [rows, words], contiguous) gets
        the matcher's allowed tokens."""
        import llguidance.numpy

        t0 = time.perf_counter()
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, rows, mask)
        self.rows_filled += len(rows)
        self.fill_seconds += time.perf_counter() - t0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def accept(matcher: Any, token: int) -> bool:
    """Advance a matcher by the token its sequence drew; False if the grammar refuses it."""
    return bool(matcher.consume_token(token))


def terminated(matcher: Any, token: int, eos_ids: frozenset[int]) -> bool:
    """The grammar took its end: an EOS id, allowed only once the answer is complete. (A matcher that
    can take nothing more but EOS is not done: its next mask allows only EOS.)"""
    return token in eos_ids and bool(matcher.is_stopped())


def allowed_ids(mask_row: np.ndarray, vocab: int) -> np.ndarray:
    """The ids a packed mask row allows (tests and debugging)."""
    bits = np.unpackbits(np.ascontiguousarray(mask_row).view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)
