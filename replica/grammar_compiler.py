"""Grammars for structured output, with xgrammar: compile once per schema, one matcher per sequence.

The one module that imports the grammar library, and only when a request first asks for a response
format, so a replica without the library serves plain requests. Why xgrammar: it filled a 128,256-id
token mask for a typical JSON schema in the fewest microseconds of the three maintained libraries
(docs/engine.md, "Structured output"; docs/bench/cpu_grammar_mask_cost.json).

- The tokenizer's info (every id's bytes, the model's vocabulary size, its EOS ids) is built once,
  on the compile thread, the first time it is needed (about half a second for 128k ids).
- Compiling runs on a thread of its own, never on the engine's step loop or an event loop; results
  are kept in an LRU keyed by the spec (compact JSON), so a repeated schema compiles once. A
  schema the library refuses fails its future with InvalidRequestError (HTTP 400).
- Whitespace is bounded (MAX_WHITESPACE per gap): a model may pretty-print, but it cannot fill its
  whole answer with spaces and never close the object.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from replica.errors import InvalidRequestError
from replica.grammar_spec import GrammarSpec

CACHE_SIZE = 128  # compiled grammars kept (a compiled JSON schema is tens of KB to a few MB)
MAX_WHITESPACE = 8  # spaces or newlines in one gap between JSON tokens (pretty-printing to depth 3)
PARALLEL_FILL_ROWS = 4  # from this many constrained rows a step fills masks on the thread pool


class GrammarCompiler:
    """One per engine: the tokenizer's info, the compile thread, the LRU and the fill pool."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...], threads: int = 0) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_ids = list(eos_ids)
        self._threads = threads or min(8, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairlane-grammar")
        self._lock = threading.Lock()
        self._cache: OrderedDict[GrammarSpec, Future] = OrderedDict()
        self._compiler = None  # built on the compile thread
        self._batch = None  # xgrammar's batch filler, built with the compiler
        self.compiles = 0  # grammars compiled (cache misses)
        self.rows_filled = 0  # mask rows filled, and the host seconds they took (benchmarks read them)
        self.fill_seconds = 0.0

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

    def _compile(self, spec: GrammarSpec):
        self.compiles += 1
        compiler = self._ensure_compiler()
        strict = spec.kind == "json_schema"  # json_object: any properties of any JSON object
        try:
            return compiler.compile_json_schema(
                spec.schema, any_whitespace=True, max_whitespace_cnt=MAX_WHITESPACE, strict_mode=strict
            )
        except (RuntimeError, ValueError) as exc:
            raise InvalidRequestError(f"response_format: the JSON schema cannot be compiled: {exc}") from None

    def _ensure_compiler(self):
        if self._compiler is None:
            try:  # imported here, on the compile thread: it takes a second the first time
                import xgrammar as xgr
            except ImportError:
                raise InvalidRequestError("response_format needs the xgrammar package here") from None
            if self._tokenizer is None:
                raise InvalidRequestError("response_format needs the model's tokenizer; this model has none")
            info = xgr.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._eos_ids
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=self._threads, cache_enabled=False)
            self._batch = xgr.BatchGrammarMatcher(max_threads=self._threads)
        return self._compiler

    def matcher(self, compiled) -> Any:
        """A fresh matcher at the grammar's start (one per sequence; n > 1 gets one per sample)."""
        import xgrammar as xgr

        return xgr.GrammarMatcher(compiled)

    def fill(self, matchers: list, mask: Any) -> None:
        """Row i of `mask` (a CPU int32 tensor, [rows, words]) gets matchers[i]'s allowed tokens."""
        t0 = time.perf_counter()
        if len(matchers) >= PARALLEL_FILL_ROWS:
            self._batch.batch_fill_next_token_bitmask(matchers, mask)
        else:
            for row, matcher in enumerate(matchers):
                matcher.fill_next_token_bitmask(mask, row)
        self.rows_filled += len(matchers)
        self.fill_seconds += time.perf_counter() - t0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def accept(matcher: Any, token: int) -> bool:
    """Advance a matcher by the token its sequence drew; False if the grammar refuses it."""
    return bool(matcher.accept_token(token))


def terminated(matcher: Any) -> bool:
    """The grammar is complete and its end (an EOS id) accepted: nothing may follow."""
    return bool(matcher.is_terminated())


def allowed_ids(mask_row: np.ndarray, vocab: int) -> np.ndarray:
    """The ids a packed mask row allows (tests and debugging)."""
    bits = np.unpackbits(mask_row.view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)
