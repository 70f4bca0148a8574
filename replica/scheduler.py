"""Iteration-level scheduling: which sequences run in the next step, and how many tokens each.

Every step, running sequences go first (a decode token, or the next chunk of a long prompt), then
waiting ones join in arrival order while the token budget, the sequence cap and the KV cache allow.
Prefill and decode share one step. When the cache runs out, the most recently arrived running
sequence is preempted: its blocks are freed and it is recomputed later from its tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from replica.block_manager import BlockManager
from replica.sequence import SeqStatus, Sequence


@dataclass
class ScheduledSeq:
    seq: Sequence
    start: int  # position of the first new token
    num_new: int  # tokens computed this step
    samples: bool  # the step draws the sequence's next token
    prev_row: int  # >= 0: the input token is row prev_row of the previous step's samples


@dataclass
class StepPlan:
    step_id: int
    items: list[ScheduledSeq]  # single-token items first, then multi-token chunks
    num_decode: int
    num_tokens: int

    @property
    def sampling_items(self) -> list[ScheduledSeq]:
        return [item for item in self.items if item.samples]


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._next_step = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan | None:
        """Pick the next step's work and claim its cache slots, or None when nothing can run."""
        budget = self.max_num_batched_tokens
        items: list[ScheduledSeq] = []
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING or seq.reached_length_limit() or seq.uncomputed() == 0:
                continue
            num_new = min(seq.uncomputed(), budget)
            if not self._make_room(seq, seq.num_computed + num_new):
                continue
            items.append(self._claim(seq, num_new))
            budget -= num_new
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_pending:  # preempted while its last token was in flight: wait for it
                break
            num_new = min(seq.uncomputed(), budget)
            if not self.blocks.can_allocate(
                self.blocks.blocks_needed(seq.block_table, seq.num_computed + num_new)
            ):
                break
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            items.append(self._claim(seq, num_new))
            budget -= num_new
        return self._plan(items) if items else None

    def _make_room(self, seq: Sequence, num_tokens: int) -> bool:
        """Free blocks for `seq` by preempting the latest arrivals; False if `seq` itself was preempted."""
        while not self.blocks.can_allocate(self.blocks.blocks_needed(seq.block_table, num_tokens)):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def _claim(self, seq: Sequence, num_new: int) -> ScheduledSeq:
        start = seq.num_computed
        had = len(seq.block_table)
        self.blocks.allocate(seq.block_table, start + num_new)
        if seq.block_array is not None and len(seq.block_table) > had:
            seq.block_array[had : len(seq.block_table)] = seq.block_table[had:]
        samples = start + num_new == seq.num_tokens
        prev_row = seq.pending_row if seq.num_pending else -1
        seq.num_computed += num_new
        return ScheduledSeq(seq, start, num_new, samples, prev_row)

    def _plan(self, items: list[ScheduledSeq]) -> StepPlan:
        items.sort(key=lambda item: item.num_new > 1)  # stable: decodes first, then chunks
        num_decode = sum(1 for item in items if item.num_new == 1)
        plan = StepPlan(self._next_step, items, num_decode, sum(item.num_new for item in items))
        self._next_step += 1
        for row, item in enumerate(plan.sampling_items):
            item.seq.num_pending += 1
            item.seq.pending_row = row
        return plan

    def preempt(self, seq: Sequence) -> None:
        """Drop `seq`'s cache and send it to the front of the queue; it is recomputed later."""
        self.running.remove(seq)
        self.blocks.free(seq.block_table)
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End `seq` wherever it is and return its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq.block_table)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
