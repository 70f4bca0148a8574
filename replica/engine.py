"""The replica engine's public, asyncio-facing API.

    engine = Engine(EngineConfig(model="smollm2-135m", device="cpu"))
    await engine.start()
    async for out in engine.generate(prompt_ids, SamplingParams(max_tokens=32), request_id="r1"):
        ...
    await engine.stop()

The step loop runs on a thread of its own (`EngineCore`), so a forward pass never blocks the event
loop that streams tokens to clients. Requests enter through a thread-safe inbox; outputs come back
in one batch per step through `loop.call_soon_threadsafe`, and each goes to its request's callback
there (`submit`; `generate` streams them through a queue).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from collections.abc import Sequence as SeqOf

from replica.attention_metadata import DecodeKernelShape
from replica.block_manager import BlockManager
from replica.cache_summary import CacheSummary, build_summary
from replica.config import EngineConfig
from replica.detokenizer import IncrementalDetokenizer
from replica.device_choice import pick_device, pick_dtype, resolve_mode
from replica.engine_core import EngineCore, _Abort, _Add, _Hold
from replica.engine_sizes import EngineSizes, sizes_for
from replica.errors import (
    AdapterError,
    DuplicateRequestError,
    EngineStoppedError,
    InvalidRequestError,
    UnknownAdapterError,
)
from replica.fp8_linear import require_fp8_device
from replica.generation_defaults import GenerationDefaults
from replica.grammar_compiler import GrammarCompiler
from replica.kv_quant import cache_dtype
from replica.late_launch import LateLaunch
from replica.lora_adapter import LoraAdapter
from replica.lora_registry import LoraRegistry, build_lora
from replica.model_loader import LoadedModel, load_model
from replica.model_runner import ModelRunner
from replica.open_request import OpenRequest, OutputCallback
from replica.outputs import EngineStats, RequestMetrics, RequestOutput
from replica.prefix_cache import chain_root
from replica.request_intake import check_fits, check_params, make_sequences, prompt_ids
from replica.sampling_params import SamplingParams
from replica.scheduler import Scheduler
from replica.sequence import Sequence

log = logging.getLogger(__name__)
MAX_CONTEXT_CAP = 8192


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = pick_device(config.device)
        self.dtype = pick_dtype(config.dtype, self.device)
        if config.quantization is not None:  # refused here, before any weight is read
            require_fp8_device(self.device, f"quantization '{config.quantization}'")
        if config.kv_cache_dtype == "fp8":  # the same rule for an FP8 KV cache (replica/kv_quant.py)
            require_fp8_device(self.device, "kv_cache_dtype 'fp8'")
        self.kv_dtype = cache_dtype(config.kv_cache_dtype, self.dtype)
        self.mode = resolve_mode(config.mode, self.device)
        self.loaded: LoadedModel | None = None
        self.core: EngineCore | None = None
        self.max_model_len = 0
        self.sizes: EngineSizes | None = None  # chosen at start (replica/engine_sizes.py)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, OpenRequest] = {}
        self.lora: LoraRegistry | None = None  # registered adapters (LoRA on), set at start

    # ---- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.core = await asyncio.to_thread(self._build_core)
        self.core.deliver = self._deliver_threadsafe
        if self.device.type == "cuda":  # before serving: see prepare_grammars
            await self.prepare_grammars()
        if self.config.gil_switch_interval_ms is not None and self.device.type == "cuda":
            sys.setswitchinterval(self.config.gil_switch_interval_ms / 1000.0)  # process-wide, see config
        self._thread = threading.Thread(target=self.core.run, name="fairlane-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        if self._thread is None:
            return
        self.core.stop()
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        if self.core.grammars is not None:
            self.core.grammars.close()
        self.core.runner.close()  # give the KV cache and graph pool back: a new engine may start here

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _build_core(self) -> EngineCore:
        cfg = self.config
        self.loaded = load_model(
            cfg.model,
            self.device,
            self.dtype,
            cfg.random_weights,
            cfg.weights_seed,
            cfg.quantization,
            cfg.fp8_skip_modules,
        )
        # The model's own limit: max_position_embeddings, or a sliding window (replica/architectures.py)
        self.max_model_len = min(cfg.max_model_len or MAX_CONTEXT_CAP, self.loaded.max_model_len)
        # Multi-LoRA: the slot pool takes its memory before the KV cache is sized from what is left.
        self.lora, lora_slots = build_lora(cfg, self.loaded.model, self.device, self.dtype)
        per_block = ModelRunner.kv_bytes_per_block(self.loaded.model, cfg.block_size, self.kv_dtype)
        self.sizes = sizes = sizes_for(cfg, self.device, per_block)
        num_blocks = sizes.num_kv_blocks
        blocks = BlockManager(num_blocks, cfg.block_size)
        decode_kernel = DecodeKernelShape(
            splits=cfg.decode_attention_splits, tile=cfg.decode_attention_tile, rope=cfg.decode_attention_rope
        )
        runner = ModelRunner(
            self.loaded.model, self.device, num_blocks, cfg.block_size, sizes.max_num_batched_tokens,
            sizes.max_num_seqs, self.max_model_len, cfg.cuda_graphs, cfg.fused_kernels, cfg.mixed_cuda_graphs,
            decode_kernel=decode_kernel, k_slices=cfg.decode_k_slices, triton_gemms=cfg.decode_triton_gemms,
            context_graphs=cfg.context_cuda_graphs, lora=lora_slots, kv_dtype=self.kv_dtype,
        )  # fmt: skip
        whole = cfg.keep_prompts_whole and bool(runner.mixed.fresh)  # the rule serves the graphs
        scheduler = Scheduler(
            blocks,
            sizes.max_num_seqs,
            sizes.max_num_batched_tokens,
            runner.table_width,
            keep_prompts_whole=whole,
            lora=lora_slots,
        )
        if lora_slots is not None:  # a load into an evicted slot waits for the step in flight
            lora_slots.fence = lambda: runner._last_compute_done
        late_wanted = cfg.late_launch if cfg.late_launch is not None else self.device.type == "cuda"
        late = LateLaunch(cfg.late_launch_margin_ms) if late_wanted else None
        return EngineCore(runner, scheduler, set(self.eos_token_ids), self.mode, cfg.profile_history, late)

    def describe(self) -> dict:
        """What this engine runs on and with (after start): device, dtype, mode and sizes."""
        return {
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "kv_cache_dtype": str(self.kv_dtype).removeprefix("torch."),
            "mode": self.mode,
            "max_model_len": self.max_model_len,
            **self.sizes.as_dict(),
        }

    # ---- requests --------------------------------------------------------------------------------
    def hold(self) -> None:
        """Admit new requests but start no new step until `release` (benchmarks use it so that every
        mode starts from the same first batch, whatever the thread timing)."""
        self.core.inbox.put(_Hold(True))

    def release(self) -> None:
        self.core.inbox.put(_Hold(False))

    @property
    def open_streams(self) -> int:
        """Requests admitted whose streams have not ended."""
        return len(self._streams)

    @property
    def tokenizer(self):
        return self.loaded.tokenizer if self.loaded else None

    # ---- the checkpoint's own settings (after start) ---------------------------------------------
    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a sequence unless a request sets ignore_eos (config.json's,
        generation_config.json's and the tokenizer's)."""
        return self.loaded.eos_token_ids

    @property
    def generation_defaults(self) -> GenerationDefaults:
        """generation_config.json's values; `.sampling_overrides()` gives them as SamplingParams fields."""
        return self.loaded.generation_defaults

    @property
    def load_seconds(self) -> float:
        return self.loaded.load_seconds

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequestError("this model has no chat template")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def generate(
        self,
        prompt: SeqOf[int] | str,
        params: SamplingParams,
        request_id: str | None = None,
        cache_scope: str = "",
        priority: int = 0,
        adapter: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs (each sample's under its `index`); it ends when every sample has.
        Leaving the loop early aborts the request and frees its KV blocks. `cache_scope`: whose
        prefix cache the request may use (the router's tenant or cache group, and a salt); requests
        of different scopes never share cached blocks. `priority`: the request's SLA tier (0 first);
        the scheduler admits and preempts by it (replica/scheduler.py). `adapter`: a registered LoRA
        adapter's name (None: the base model); an unknown one raises UnknownAdapterError."""
        outputs: asyncio.Queue = asyncio.Queue()
        request = await self.submit(
            prompt, params, outputs.put_nowait, request_id, cache_scope, priority, adapter
        )
        open_samples = len(request.seqs)
        try:
            while open_samples:
                item = await outputs.get()
                if isinstance(item, Exception):
                    raise item
                open_samples -= item.finished
                yield item
        finally:
            request.cancel()  # nothing once every sample ended

    async def submit(
        self,
        prompt: SeqOf[int] | str,
        params: SamplingParams,
        on_output: OutputCallback,
        request_id: str | None = None,
        cache_scope: str = "",
        priority: int = 0,
        adapter: str | None = None,
    ) -> OpenRequest:
        """Admit a request whose outputs go to `on_output`, called on this event loop as each step's
        outputs arrive: every sample's outputs in order, then nothing after the last (or after an
        `Exception`: the request failed). `cancel()` on the answer aborts it and frees its KV blocks.
        The arguments are `generate`'s; invalid ones raise here, before the engine sees the request."""
        request_id = request_id or uuid.uuid4().hex
        seqs, detoks = self._admit(prompt, params, request_id, cache_scope, priority, adapter)
        # Work ahead of this request's first token, in the routers' units (kv_router): its uncached
        # prompt and its answer budget, until it produces.
        waiting = seqs[0].num_prompt - self.core.scheduler.cached_tokens(seqs[0])
        waiting += params.max_tokens * len(seqs)
        request_id = seqs[0].request_id
        request = OpenRequest(request_id, tuple(seqs), on_output, waiting, self._forget, self._abort_open)
        for seq in seqs:  # outputs go to this request, never to a later one of the same id
            seq.sink = request
        self._streams[request_id] = request
        try:
            await self._attach_matchers(seqs, params)
        except BaseException:
            self._forget(request)
            raise
        self.core.inbox.put(_Add(seqs, detoks, RequestMetrics(arrival=seqs[0].arrival)))
        if self.core.crashed is not None:  # the loop stopped before it could take this request
            self._forget(request)
            raise EngineStoppedError(f"the engine loop stopped: {self.core.crashed!r}")
        return request

    @property
    def waiting_tokens(self) -> int:
        """Uncached prompt + answer budget of the requests not producing yet."""
        return sum(request.waiting for request in self._streams.values())

    def _forget(self, request: OpenRequest) -> None:
        if self._streams.get(request.request_id) is request:
            del self._streams[request.request_id]
        for seq in request.seqs:  # outputs still in flight are dropped; and no seq ↔ request cycle
            seq.sink = None  # is left for the collector: refcounting frees both at once

    def _abort_open(self, request: OpenRequest) -> None:
        self.core.inbox.put(_Abort(request.request_id, request.seqs))

    async def _attach_matchers(self, seqs: list[Sequence], params: SamplingParams) -> None:
        """A response format's grammar, compiled on the compiler's thread (or found in its cache), and
        a matcher for each sample. The request waits here, before the engine sees it; the engine's
        loop and this event loop go on meanwhile."""
        if params.grammar is None:
            return
        compiled = await asyncio.wrap_future(self.grammars.compile(params.grammar))
        for seq in seqs:
            seq.matcher = self.grammars.matcher(compiled)

    async def prepare_grammars(self) -> bool:
        """Build the grammar library's view of the tokenizer now, not with the first response format.
        It takes about a second for 128k ids and holds the interpreter lock throughout: built for a
        request, it stalled every stream of the engine, whose loop could not launch a step meanwhile
        (5% of the 8B trace's throughput on the H200). CUDA engines do it in `start`, before they
        serve; CPU engines, started by the dozen in tests, leave it to the first response format.
        False where this engine cannot constrain output (no library or no usable tokenizer)."""
        if self.tokenizer is None or importlib.util.find_spec("llguidance") is None:
            return False
        try:
            await asyncio.wrap_future(self.grammars.prepare())
        except Exception as exc:  # the first response format then gets the reason as its 400
            log.info("response formats unavailable on this engine: %s", exc)
            return False
        return True

    @property
    def grammars(self) -> GrammarCompiler:
        """The engine's grammar compiler, made with the first request that has a response format (the
        grammar library is imported then: without it a replica serves every other request)."""
        if self.core.grammars is None:
            vocab = self.loaded.config.vocab_size
            self.core.grammars = GrammarCompiler(self.tokenizer, vocab, self.eos_token_ids)
        return self.core.grammars

    async def abort(self, request_id: str) -> None:
        if self.core is not None:
            self.core.inbox.put(_Abort(request_id))

    def _admit(
        self, prompt, params: SamplingParams, request_id: str, cache_scope="", priority=0, adapter=None
    ) -> tuple[list[Sequence], list[IncrementalDetokenizer | None]]:
        """The request's sequences (one per sample) and their detokenizers, validated
        (``replica/request_intake.py``)."""
        if not self.running:
            raise EngineStoppedError("the engine is not running")
        if request_id in self._streams:
            raise DuplicateRequestError(f"request id {request_id!r} is already in flight")
        vocab = self.loaded.config.vocab_size
        ids = prompt_ids(prompt, self.tokenizer, vocab)
        check_fits(len(ids), params.max_tokens, self.max_model_len, self.core.blocks)
        check_params(params, vocab, self.sizes.max_num_seqs, self.tokenizer)
        lora = self._adapter(adapter)
        return make_sequences(
            ids,
            params,
            request_id,
            eos_ids=self.core.eos_ids,
            max_model_len=self.max_model_len,
            cache_root=self._cache_root(cache_scope, lora),
            priority=priority,
            tokenizer=self.tokenizer,
            lora=lora,
        )

    def _cache_root(self, scope: str, lora: LoraAdapter | None = None) -> bytes | None:
        """The root of the request's prefix chain: the weights (name, random or not, seed, and the
        adapter: its name and weights digest) and scope."""
        if not self.config.enable_prefix_caching:
            return None
        return chain_root(self.cache_model_key(lora.cache_key if lora is not None else None), scope)

    def cache_model_key(self, adapter_key: str | None = None) -> str:
        """What the chain's root says of the weights: the routers hash prompts under it too. A request
        with an adapter adds the adapter's `cache_key` (`adapter_cache_key`): its blocks are its own."""
        cfg = self.config
        base = f"{cfg.model}|{cfg.random_weights}|{cfg.weights_seed}"
        return base if adapter_key is None else f"{base}|{adapter_key}"

    def cache_summary(self) -> CacheSummary | None:
        """A Bloom filter over the prefix cache's keys, for the routers' replica choice (None: off)."""
        if not self.config.enable_prefix_caching or self.core is None:
            return None
        blocks = self.core.blocks
        return build_summary(blocks.cached_keys(), self.cache_model_key(), blocks.block_size)

    def _deliver_threadsafe(self, batch: list) -> None:
        self._loop.call_soon_threadsafe(self._deliver, batch)

    def _deliver(self, batch: list) -> None:
        for seq, item in batch:
            if seq.sink is not None:
                seq.sink.deliver(item)

    # ---- LoRA adapters (replica/lora_*.py; docs/engine.md "Multi-LoRA") -----------------------------
    def add_adapter(self, name: str, path: str) -> None:
        """Register a PEFT LoRA adapter: read and checked into host memory now (AdapterError names
        what does not fit), loaded into a device slot when a request first uses it."""
        if self.loaded is None:
            raise EngineStoppedError("start the engine before registering adapters")
        if self.lora is None:
            raise AdapterError("LoRA is off on this replica (lora_slots is 0)")
        self.lora.add(name, path)

    def remove_adapter(self, name: str) -> None:
        """Unregister an adapter: new requests naming it get UnknownAdapterError; requests admitted
        with it finish with it, and its slot is reused first once they have."""
        if self.lora is None:
            raise UnknownAdapterError(f"no adapter named {name!r} (LoRA is off)")
        self.lora.remove(name)

    def adapters(self) -> list[str]:
        """The registered adapters' names."""
        return self.lora.names() if self.lora is not None else []

    def resident_adapters(self) -> list[str]:
        """Adapters in device slots now (the routers prefer a replica that holds a request's)."""
        if self.lora is None or self.core is None or self.core.scheduler.lora is None:
            return []
        return self.core.scheduler.lora.resident()

    def adapter_cache_key(self, name: str) -> str:
        """What a request with this adapter adds to `cache_model_key` (the routers' prefix hashes)."""
        return self._adapter(name).cache_key

    def _adapter(self, name: str | None) -> LoraAdapter | None:
        if name is None:
            return None
        if self.lora is None:
            raise UnknownAdapterError(f"no adapter named {name!r} (LoRA is off on this replica)")
        return self.lora.get(name)

    # ---- observability -----------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        return self.core.stats if self.core else EngineStats(mode=self.mode)

    def step_pace(self, window_s: float = 10.0) -> dict[str, float]:
        """The recent back-to-back steps' sums (replica/profiler.py ``step_pace``)."""
        return self.core.profiler.pace(window_s) if self.core else {}

    def profile_summary(self) -> dict:
        return self.core.profiler.summary() if self.core else {}
