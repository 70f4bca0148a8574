"""The replica's step loop, on its own thread: schedule → launch → read back the previous step.

In async mode step N+1 is scheduled and launched before step N's tokens are read back; stop
conditions found in N's tokens therefore apply one step late, and the token such a sequence drew
in N+1 is discarded. Length limits are known ahead and never cost an extra token. In sync mode
the loop reads each step back before it schedules the next.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

from replica.block_manager import BlockManager
from replica.detokenizer import IncrementalDetokenizer
from replica.errors import RequestFailedError
from replica.grammar_masks import advance_matchers, fill_masks, needs_previous
from replica.io_buffers import StepBuffers
from replica.late_launch import LateLaunch, device_start
from replica.model_runner import ModelRunner
from replica.outputs import EngineStats, RequestMetrics, RequestOutput, TokenLogprob
from replica.profiler import StepProfiler, StepRecord
from replica.scheduler import Scheduler, StepPlan
from replica.sequence import Sequence
from replica.step_handle import StepHandle, StepResult
from replica.step_inputs import StepLayout
from replica.step_outputs import add_prompt_logprobs, take_prompt_logprobs, token_logprob

log = logging.getLogger(__name__)
Deliver = Callable[[list[tuple[Sequence, object]]], None]


@dataclass
class _Add:
    """A request: one sequence per sample (the first one is scheduled; the rest fork from it)."""

    seqs: list[Sequence]
    detokenizers: list[IncrementalDetokenizer | None]
    metrics: RequestMetrics


@dataclass
class _Abort:
    request_id: str
    seqs: tuple[Sequence, ...] | None = None  # only these (a generate call ending): not a newer same id


@dataclass
class _Read:
    """A step read back: its outputs, or the error its wait raised; when the wait began and ended."""

    result: StepResult | None
    error: Exception | None
    started: float
    done: float


@dataclass
class _Hold:
    on: bool  # True: admit requests but schedule nothing new until a _Hold(False)


class EngineCore:
    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        eos_ids: set[int],
        mode: str,
        profile_history: int,
        late: LateLaunch | None = None,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.blocks: BlockManager = scheduler.blocks
        self.eos_ids = eos_ids
        self._eos_frozen = frozenset(eos_ids)
        self.mode = mode
        self.late = late if mode == "async" else None  # None: plan each step as soon as the last began
        self.profiler = StepProfiler(profile_history)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.deliver: Deliver = lambda batch: None
        self.stats = EngineStats(mode=mode)
        self._seqs: dict[tuple[str, int], tuple[Sequence, IncrementalDetokenizer | None, RequestMetrics]] = {}
        self._requests: dict[str, list[Sequence]] = {}  # request id -> its unfinished samples
        self._outbox: list[tuple[Sequence, object]] = []
        self._stopping = False
        self._held = False
        self._finished_count = 0
        self.crashed: BaseException | None = None  # set when the loop stopped on an error
        self.grammars = None  # the engine's GrammarCompiler, set with the first response format
        self.num_constrained = 0  # unfinished sequences with a grammar matcher

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        """The loop, guarded: anything it did not expect ends every open request with an error at
        once and stops the loop (the replica turns unhealthy and is replaced)."""
        try:
            self._loop()
        except BaseException as exc:
            self.crashed = exc
            log.exception("the engine loop stopped", exc_info=exc)
            self._fail_everything(exc)

    def _fail_everything(self, exc: BaseException) -> None:
        error = f"the engine loop stopped: {exc!r}"
        for seq in [entry[0] for entry in self._seqs.values()]:
            self._outbox.append((seq, RequestFailedError(error)))
        while True:  # requests that reached the inbox before the loop stopped
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(msg, _Add):
                self._outbox.extend((seq, RequestFailedError(error)) for seq in msg.seqs[:1])
        batch, self._outbox = self._outbox, []
        self.deliver(batch)

    def _loop(self) -> None:
        inflight: StepHandle | None = None
        idle_since = time.perf_counter()
        while not self._stopping:
            self._drain_inbox(block=inflight is None and (self._held or not self.scheduler.has_work()))
            if self._held:  # requests gather in the queue; the step in flight still completes
                if inflight is not None:
                    self._complete(inflight)
                    inflight = None
                    self._flush()
                continue
            waited_ms = (time.perf_counter() - idle_since) * 1000.0
            hold_ms = self._hold_for_arrivals(inflight)
            t0 = time.perf_counter()
            plan = self.scheduler.schedule()
            schedule_ms = (time.perf_counter() - t0) * 1000.0
            handle, early = self._launch(plan, inflight)
            launched = handle is not None
            if launched:  # the wait before this step belongs to this step's record
                handle.idle_ms, handle.schedule_ms, handle.hold_ms = waited_ms, schedule_ms, hold_ms
                handle.began_at = t0
            if early is not None:  # read back already: its tokens filled this step's token masks
                handle.read_early = True
                self._finish(inflight, early)
                inflight = None
            if handle is not None and self.mode == "sync":
                self._complete(handle)
                handle = None
            if inflight is not None:
                read = self._read(inflight)
                self._finish(inflight, read)
                if handle is not None and self.late is not None:
                    handle.device_start = device_start(handle.began_at, read.started, read.done)
            elif handle is not None and early is None:  # launched onto an idle device
                handle.device_start = t0
            inflight = handle
            self._flush()
            idle_since = time.perf_counter()
            if not launched and inflight is None and self.scheduler.has_work():
                # Work waits but none could be scheduled (no free KV blocks, say): wait briefly for an
                # abort or a new request instead of spinning. A step that ran (sync mode) never waits here.
                self._drain_inbox(block=True, timeout=0.01)
        self._shutdown()

    def _hold_for_arrivals(self, inflight: StepHandle | None) -> float:
        """Take in new requests until the step in flight is about to end, so they join the next
        step instead of the one after it (replica/late_launch.py); the milliseconds held."""
        if self.late is None or inflight is None or self.scheduler.top_tier_waiting():
            return 0.0
        deadline = self.late.deadline(inflight.device_start, inflight.plan.num_decode)
        if deadline is None:
            return 0.0
        start = now = time.perf_counter()
        while now < deadline and not self._stopping and not self._held:
            self._drain_inbox(block=True, timeout=deadline - now)
            now = time.perf_counter()
        return (now - start) * 1000.0

    def stop(self) -> None:
        self.inbox.put(None)

    def _launch(
        self, plan: StepPlan | None, inflight: StepHandle | None
    ) -> tuple[StepHandle | None, _Read | None]:
        """Launch `plan`. Its token masks need every constrained sequence's matcher to have seen the
        token `inflight` drew for it: if so, `inflight` is read back (and its tokens fed to the
        matchers) just before the masks are filled, once the step's forward is enqueued; that read
        is returned for the caller to finish after the launch. Other steps never wait here."""
        if plan is None:
            return None, None
        for item in plan.items:
            _, _, metrics = self._seqs[item.seq.key]
            if metrics.first_scheduled is None:
                metrics.first_scheduled = time.monotonic()
        early: list[_Read] = []

        def masks(layout: StepLayout, buf: StepBuffers) -> None:
            if inflight is not None and not early and needs_previous(plan.sample_seqs, layout.grammar_rows):
                early.append(self._read(inflight))
            fill_masks(plan.sample_seqs, layout.grammar_rows, buf.np["token_mask"], self.grammars)

        try:
            handle = self.runner.launch(plan, masks)
        except Exception as exc:  # one bad step must not take the replica down
            self._fail_plan(plan, exc)
            self.runner.reset_carry()  # nothing may read the samples this step never made
            handle = None
        return handle, (early[0] if early else None)

    def _complete(self, handle: StepHandle) -> None:
        self._finish(handle, self._read(handle))

    def _read(self, handle: StepHandle) -> _Read:
        """Wait for a step's tokens and advance the grammar matchers of its constrained rows."""
        t0 = time.perf_counter()
        try:
            result = self.runner.wait(handle)
        except Exception as exc:
            return _Read(None, exc, t0, time.perf_counter())
        t1 = time.perf_counter()
        if self.num_constrained:  # else nothing to advance: unconstrained traffic pays nothing here
            advance_matchers(handle.plan.sample_seqs, result.tokens, self._eos_frozen)
            self.grammars.advance_seconds += time.perf_counter() - t1
        return _Read(result, None, t0, t1)

    def _finish(self, handle: StepHandle, read: _Read) -> None:
        if read.error is not None:
            # The next step is launched already: the rows it carries from this one belong to this
            # step's sequences, which end here, so its samples stay good for the step after it.
            self._fail_plan(handle.plan, read.error)
            return
        result = read.result
        t1 = time.perf_counter()
        for scores in result.prompt_scores:
            add_prompt_logprobs(scores)
        for row, (seq, token) in enumerate(zip(handle.plan.sample_seqs, result.tokens.tolist(), strict=True)):
            seq.num_pending -= 1
            if not seq.finished:  # else: the extra token of a sequence that stopped a step ago
                self._accept_token(seq, token, token_logprob(result, row, seq))
        t2 = time.perf_counter()
        self._record(handle, wait_ms=(read.done - read.started) * 1000.0, post_ms=(t2 - t1) * 1000.0)

    # ---- tokens, stops and outputs ------------------------------------------------------------------
    def _accept_token(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> None:
        _, detok, metrics = self._seqs[seq.key]
        if seq.params.max_tokens == 0:  # prompt scoring only: the drawn token is not an output
            self._emit(seq, [], "length")
            return
        if seq.grammar_error is not None:  # never expected: the token was drawn under its mask
            self._fail_request(seq.request_id, RequestFailedError(seq.grammar_error))
            return
        seq.tokens.append(token)
        if metrics.first_token is None:
            metrics.first_token = time.monotonic()
        armed = seq.num_output >= seq.params.min_tokens  # no stop before min_tokens (as vLLM)
        reason = None
        if detok is not None:
            detok.add(token, check_stops=armed)
            if detok.stopped:
                reason = "stop"
        eos = token in self.eos_ids and not seq.params.ignore_eos
        # A finished grammar has taken its end (an EOS id): the sequence stops even under ignore_eos.
        if (armed and (eos or token in seq.params.stop_token_ids)) or (reason is None and seq.grammar_done):
            reason = "stop"
        elif reason is None and (seq.num_output >= seq.params.max_tokens or len(seq.tokens) >= seq.max_len):
            reason = "length"
        self._emit(seq, [token], reason, [logprob] if logprob is not None else None)

    def _emit(
        self, seq: Sequence, token_ids: list[int], reason: str | None, logprobs: list | None = None
    ) -> None:
        _, detok, metrics = self._seqs[seq.key]
        if reason is not None:
            self._end(seq, reason)
            metrics.finished = time.monotonic()
            metrics.num_preemptions = seq.num_preemptions
        text = detok.take(final=reason is not None) if detok is not None else ""
        out = RequestOutput(
            seq.request_id, token_ids, text, reason, seq.num_prompt, seq.num_output,
            metrics if reason is not None else None, seq.index, logprobs, take_prompt_logprobs(seq),
            seq.num_cached_tokens,
        )  # fmt: skip
        self._outbox.append((seq, out))

    def _end(self, seq: Sequence, reason: str) -> None:
        """Take a finished sample out of the scheduler and the registries."""
        self.scheduler.finish(seq, reason)
        del self._seqs[seq.key]
        self.num_constrained -= seq.matcher is not None
        samples = self._requests[seq.request_id]
        samples.remove(seq)
        if not samples:
            del self._requests[seq.request_id]
        self._finished_count += 1

    def _fail_plan(self, plan: StepPlan, exc: Exception) -> None:
        log.exception("step %d failed; ending its %d requests", plan.step_id, len(plan.items), exc_info=exc)
        request_ids = {item.seq.request_id for item in plan.items} | {s.request_id for s in plan.sample_seqs}
        for request_id in request_ids:
            error = RequestFailedError(f"request {request_id} failed in step {plan.step_id}: {exc!r}")
            self._fail_request(request_id, error)

    def _fail_request(self, request_id: str, error: RequestFailedError) -> None:
        for seq in list(self._requests.get(request_id, ())):
            self._end(seq, "error")
            self._outbox.append((seq, error))

    def _flush(self) -> None:
        self._update_stats()
        if self._outbox:
            batch, self._outbox = self._outbox, []
            self.deliver(batch)

    # ---- inbox -----------------------------------------------------------------------------------
    def _drain_inbox(self, block: bool, timeout: float | None = None) -> None:
        try:
            msg = self.inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                break
        self._flush()

    def _handle(self, msg) -> None:
        if msg is None:
            self._stopping = True
        elif isinstance(msg, _Add):
            for seq, detok in zip(msg.seqs, msg.detokenizers, strict=True):
                self._seqs[seq.key] = (seq, detok, msg.metrics)
                self.num_constrained += seq.matcher is not None
            self._requests[msg.seqs[0].request_id] = list(msg.seqs)
            self.scheduler.add(msg.seqs[0])
        elif isinstance(msg, _Hold):
            self._held = msg.on
        elif isinstance(msg, _Abort):
            for seq in list(self._requests.get(msg.request_id, ())):
                if msg.seqs is None or any(seq is mine for mine in msg.seqs):
                    self._emit(seq, [], "abort")

    def _shutdown(self) -> None:
        for seq, _, _ in list(self._seqs.values()):
            self._emit(seq, [], "abort")
        self._flush()

    # ---- stats and profile ---------------------------------------------------------------------------
    def _record(self, handle: StepHandle, wait_ms: float, post_ms: float) -> None:
        plan = handle.plan
        prefill_tokens = plan.num_tokens - plan.num_decode
        record = StepRecord(
            step_id=plan.step_id,
            at=time.monotonic(),
            batch_size=len(plan.items),
            num_tokens=plan.num_tokens,
            num_prefill_tokens=prefill_tokens,
            num_sampled=len(plan.sample_seqs),
            context_tokens=sum(item.start + item.num_new for item in plan.items),
            postprocess_ms=post_ms,
            wait_ms=wait_ms,
            idle_ms=handle.idle_ms,
            schedule_ms=handle.schedule_ms,
            kind=handle.kind,
            graphed=handle.graphed,
            hold_ms=handle.hold_ms,
            masked_rows=handle.masked_rows,
            read_early=handle.read_early,
            **handle.timings_ms(),
        )
        self.profiler.add(record)
        if self.late is not None:
            host_ms = record.schedule_ms + record.prepare_ms + record.launch_ms
            self.late.observe(plan.num_decode, prefill_tokens, record.compute_ms, host_ms, record.h2d_ms)

    def _update_stats(self) -> None:
        self.stats = EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_total=self.blocks.num_usable,
            kv_blocks_used=self.blocks.num_used,
            kv_blocks_free=self.blocks.num_free,
            num_preemptions=self.scheduler.num_preemptions,
            steps=self.profiler.total_steps,
            requests_finished=self._finished_count,
            output_tokens_per_s=self.profiler.output_tokens_per_s(),
            mode=self.mode,
            prompt_tokens=self.scheduler.num_prompt_tokens,
            cached_prompt_tokens=self.scheduler.num_cached_tokens,
            kv_blocks_cached=self.blocks.num_cached,
            kv_evictions=self.blocks.num_evictions,
        )
