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
from replica.model_runner import ModelRunner, StepHandle
from replica.outputs import EngineStats, RequestMetrics, RequestOutput
from replica.profiler import StepProfiler, StepRecord
from replica.scheduler import Scheduler, StepPlan
from replica.sequence import Sequence

log = logging.getLogger(__name__)
Deliver = Callable[[list[tuple[Sequence, object]]], None]


@dataclass
class _Add:
    seq: Sequence
    detokenizer: IncrementalDetokenizer | None
    metrics: RequestMetrics


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Hold:
    on: bool  # True: admit requests but schedule nothing new until a _Hold(False)


class EngineCore:
    def __init__(
        self, runner: ModelRunner, scheduler: Scheduler, eos_ids: set[int], mode: str, profile_history: int
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.blocks: BlockManager = scheduler.blocks
        self.eos_ids = eos_ids
        self.mode = mode
        self.profiler = StepProfiler(profile_history)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.deliver: Deliver = lambda batch: None
        self.stats = EngineStats(mode=mode)
        self._seqs: dict[str, tuple[Sequence, IncrementalDetokenizer | None, RequestMetrics]] = {}
        self._outbox: list[tuple[Sequence, object]] = []
        self._stopping = False
        self._held = False
        self._finished_count = 0

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
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
            t0 = time.perf_counter()
            plan = self.scheduler.schedule()
            schedule_ms = (time.perf_counter() - t0) * 1000.0
            handle = self._launch(plan)
            launched = handle is not None
            if launched:  # the wait before this step belongs to this step's record
                handle.idle_ms, handle.schedule_ms = waited_ms, schedule_ms
            if handle is not None and self.mode == "sync":
                self._complete(handle)
                handle = None
            if inflight is not None:
                self._complete(inflight)
            inflight = handle
            self._flush()
            idle_since = time.perf_counter()
            if not launched and inflight is None and self.scheduler.has_work():
                # Work waits but none could be scheduled (no free KV blocks, say): wait briefly for an
                # abort or a new request instead of spinning. A step that ran (sync mode) never waits here.
                self._drain_inbox(block=True, timeout=0.01)
        self._shutdown()

    def stop(self) -> None:
        self.inbox.put(None)

    def _launch(self, plan: StepPlan | None) -> StepHandle | None:
        if plan is None:
            return None
        for item in plan.items:
            _, _, metrics = self._seqs[item.seq.request_id]
            if metrics.first_scheduled is None:
                metrics.first_scheduled = time.monotonic()
        try:
            return self.runner.launch(plan)
        except Exception as exc:  # one bad step must not take the replica down
            self._fail_plan(plan, exc)
            return None

    def _complete(self, handle: StepHandle) -> None:
        t0 = time.perf_counter()
        try:
            sampled = self.runner.wait(handle)
        except Exception as exc:
            self._fail_plan(handle.plan, exc)
            return
        t1 = time.perf_counter()
        for item, token in zip(handle.plan.sampling_items, sampled.tolist(), strict=True):
            seq = item.seq
            seq.num_pending -= 1
            if not seq.finished:  # else: the extra token of a sequence that stopped a step ago
                self._accept_token(seq, token)
        t2 = time.perf_counter()
        self._record(handle, wait_ms=(t1 - t0) * 1000.0, post_ms=(t2 - t1) * 1000.0)

    # ---- tokens, stops and outputs ------------------------------------------------------------------
    def _accept_token(self, seq: Sequence, token: int) -> None:
        seq.tokens.append(token)
        _, detok, metrics = self._seqs[seq.request_id]
        if metrics.first_token is None:
            metrics.first_token = time.monotonic()
        reason = None
        if detok is not None:
            detok.add(token)
            if detok.stopped:
                reason = "stop"
        if (token in self.eos_ids and not seq.params.ignore_eos) or token in seq.params.stop_token_ids:
            reason = "stop"
        elif reason is None and (seq.num_output >= seq.params.max_tokens or len(seq.tokens) >= seq.max_len):
            reason = "length"
        self._emit(seq, [token], reason)

    def _emit(self, seq: Sequence, token_ids: list[int], reason: str | None) -> None:
        _, detok, metrics = self._seqs[seq.request_id]
        if reason is not None:
            self.scheduler.finish(seq, reason)
            metrics.finished = time.monotonic()
            metrics.num_preemptions = seq.num_preemptions
            del self._seqs[seq.request_id]
            self._finished_count += 1
        text = detok.take(final=reason is not None) if detok is not None else ""
        out = RequestOutput(
            seq.request_id,
            token_ids,
            text,
            reason,
            seq.num_prompt,
            seq.num_output,
            metrics if reason is not None else None,
        )
        self._outbox.append((seq, out))

    def _fail_plan(self, plan: StepPlan, exc: Exception) -> None:
        log.exception("step %d failed; ending its %d requests", plan.step_id, len(plan.items), exc_info=exc)
        self.runner.reset_carry()
        for item in plan.items:
            seq = item.seq
            if seq.finished:
                continue
            self.scheduler.finish(seq, "error")
            self._seqs.pop(seq.request_id, None)
            self._finished_count += 1
            error = RequestFailedError(f"request {seq.request_id} failed in step {plan.step_id}: {exc!r}")
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
            self._seqs[msg.seq.request_id] = (msg.seq, msg.detokenizer, msg.metrics)
            self.scheduler.add(msg.seq)
        elif isinstance(msg, _Hold):
            self._held = msg.on
        elif isinstance(msg, _Abort):
            entry = self._seqs.get(msg.request_id)
            if entry is not None:
                self._emit(entry[0], [], "abort")

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
            num_sampled=len(plan.sampling_items),
            context_tokens=sum(item.start + item.num_new for item in plan.items),
            postprocess_ms=post_ms,
            wait_ms=wait_ms,
            idle_ms=handle.idle_ms,
            schedule_ms=handle.schedule_ms,
            **handle.timings_ms(),
        )
        self.profiler.add(record)

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
        )
