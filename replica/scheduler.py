"""Iteration-level scheduling: which sequences run in the next step, and how many tokens each.

Every step, running sequences go first (a decode token, or the next chunk of a long prompt), then
waiting ones join while the token budget, the sequence cap and the KV cache allow. Both lists are
kept in rank order: SLA tier (the request's `priority`, 0 first), then arrival.
With ``keep_prompts_whole`` (on where mixed CUDA graphs run), a prompt that fits one step whole is
not split behind another prompt's chunk: it starts the next step instead, so steps rarely continue
a prompt (those run eagerly; see mixed_graphs.py).
Prefill and decode share one step. When the cache runs out, the lowest tier's most recently arrived
running sequence is preempted: its blocks are freed and it is recomputed later from its tokens.

SLA tiers. A waiting sequence of a higher tier than some running ones does not wait behind them:
before the step is planned, lower-tier running sequences are preempted (lowest tier, latest arrival
first) until its first chunk has a row and its blocks, and lower-tier prompt chunks give way to it
in that step's token budget; so its prefill starts in the next step launched. Lower-tier decodes
still run. With one tier (the router's `fcfs` and `vtc` policies send every request at tier 0)
this is plain arrival order.

A request with n > 1 samples enters as its parent sequence; it is admitted only when the scheduler
has rows for every sample (they stay reserved), and the step that finishes its prompt forks the
others: each takes the prompt's full blocks (shared, reference-counted) and a copy of its last,
partial block (copied on the device after that step), and draws its first token from the same row.

Each running sequence owns one row of `block_rows`, a preallocated (max_num_seqs × table width)
array that mirrors its block table; the input builder gathers a step's tables from it in one
indexing operation instead of stacking hundreds of per-sequence arrays.

Prefix caching (a sequence with a `cache_root`): on admission a sequence takes the longest run of
registered blocks that its tokens' chain keys find (never its last token: the step that computes it
draws the first output) and starts computing after them. Its own full blocks are registered once a
launched step has written them and the host knows their tokens: at the claim after that step, and
when it finishes or is preempted (a failed one's blocks are forgotten instead). Registering only
what an earlier step wrote means a hit never reads keys being written in the same step.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from replica.block_manager import BlockManager
from replica.prefix_cache import extend_chain
from replica.sequence import RANK, SeqStatus, Sequence


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    start: int  # position of the first new token
    num_new: int  # tokens computed this step
    samples: bool  # the step draws the sequence's next token
    prev_row: int  # >= 0: the input token is row prev_row of the previous step's samples


@dataclass
class Fork:
    """A sample that starts in this step from its parent's prompt."""

    parent: Sequence
    child: Sequence
    copy: tuple[int, int] | None  # (parent's partial last block, the child's copy of it)


@dataclass
class StepPlan:
    step_id: int
    items: list[ScheduledSeq]  # single-token items first, then multi-token chunks
    num_decode: int
    num_tokens: int
    block_rows: np.ndarray  # the scheduler's table rows; item.seq.row indexes it
    forks: list[Fork] = field(default_factory=list)
    # Who draws each sample row, in row order: an item's sequence, then the samples it forks; and
    # the index of the item whose last token row each one draws from.
    sample_seqs: list[Sequence] = field(default_factory=list)
    sample_items: list[int] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        table_width: int = 256,
        keep_prompts_whole: bool = True,
        lora=None,
    ) -> None:
        self.blocks = blocks
        self.lora = lora  # the device's adapter slots (replica/lora_slots.py); None: LoRA off
        self.keep_prompts_whole = keep_prompts_whole
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_rows = np.zeros((max_num_seqs, table_width), dtype=np.int64)
        self._free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._next_step = 0
        self._reserved_rows = 0  # rows held for the forks of admitted parents
        self._forks: list[Fork] = []  # made while planning the current step
        self.num_prompt_tokens = 0  # prompt tokens of requests admitted (once each)
        self.num_cached_tokens = 0  # of those, found in the prefix cache

    def add(self, seq: Sequence) -> None:
        insort(self.waiting, seq, key=RANK)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def top_tier_waiting(self) -> bool:
        """A sequence of the first SLA tier waits: whatever arrives now could not go ahead of it."""
        return bool(self.waiting) and self.waiting[0].priority == 0

    def schedule(self) -> StepPlan | None:
        """Pick the next step's work and claim its cache slots, or None when nothing can run."""
        budget = self.max_num_batched_tokens
        items: list[ScheduledSeq] = []
        room = self.blocks.block_size
        running = SeqStatus.RUNNING
        # A waiting sequence that outranks running ones: room is made for it, and lower-tier prompt
        # chunks leave it the budget. A steady single-tier step pays two comparisons here.
        urgent = self.waiting[0].priority if self.waiting else None
        if urgent is not None and self.running and self.running[-1].priority > urgent:
            self._make_room_for(self.waiting[0])
        else:
            urgent = None
        for seq in list(self.running):  # the hot loop at large batches: plain attribute reads only
            if budget == 0:
                break
            total = len(seq.tokens) + seq.num_pending
            computed = seq.num_computed
            if total == computed or seq.status is not running:
                continue
            if total >= seq.token_limit and computed >= seq.num_prompt:
                continue  # at its limit: the last token is in flight (a prompt-only request's
                # remaining prompt chunks still run: its limit is its prompt)
            if urgent is not None and total - computed > 1 and seq.priority > urgent:
                continue  # a lower tier's prompt chunk waits a step for the higher tier's prefill
            num_new = total - computed if total - computed < budget else budget
            needs_blocks = computed + num_new > len(seq.block_table) * room or seq.forks
            if needs_blocks and not self._make_room(seq, computed + num_new):
                continue
            items.append(self._claim(seq, num_new))
            budget -= num_new
        # The whole-prompt rule is asked only when something waits: a steady decode step pays nothing.
        rule = self.keep_prompts_whole and bool(self.waiting)
        has_chunk = rule and any(item.num_new > 1 for item in items)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if not self._has_rows_for(seq):
                break
            if seq.num_pending:  # preempted while its last token was in flight: wait for it
                break
            if seq.lora is not None and seq.lora_slot < 0 and not self._take_slot(seq):
                break  # its adapter is loading, or every slot is held: it waits (replica/lora_slots.py)
            hits = self._lookup(seq)
            remaining = seq.uncomputed() - len(hits) * self.blocks.block_size
            if has_chunk and budget < remaining <= self.max_num_batched_tokens:
                # It fits a later step whole. Split, its tail would make the next step one that
                # continues a prompt, which runs eagerly (no CUDA graph) and is bound by Python.
                # The next step takes it first: only decodes and over-budget prompts go before it.
                break
            num_new = min(remaining, budget)
            if not self.blocks.can_allocate(self._blocks_for(seq, num_new, hits)):
                break
            self.waiting.popleft()
            self._admitted(seq, hits)
            seq.status = SeqStatus.RUNNING
            insort(self.running, seq, key=RANK)
            self._reserved_rows += len(seq.forks)
            self._take_row(seq)
            items.append(self._claim(seq, num_new))
            budget -= num_new
            has_chunk = has_chunk or (rule and num_new > 1)
        return self._plan(items) if items else None

    def _blocks_for(self, seq: Sequence, num_new: int, hits: list[int] | tuple = ()) -> int:
        """Free blocks a claim of `num_new` tokens takes after `hits` (found blocks, some of them on
        the free list), with its forks' partial blocks if it ends the prompt."""
        size = self.blocks.block_size
        computed = seq.num_computed + len(hits) * size
        needed = max(0, -(-(computed + num_new) // size) - len(seq.block_table) - len(hits))
        needed += self.blocks.unheld(hits) if hits else 0
        ends_prompt = computed + num_new == seq.num_prompt
        if seq.forks and ends_prompt and seq.num_prompt % self.blocks.block_size:
            needed += len(seq.forks)
        return needed

    def cached_tokens(self, seq: Sequence) -> int:
        """Prompt tokens of a new `seq` its admission would find cached now (an estimate for routing:
        blocks may come and go before then). Runs on the caller's thread before the engine's takes
        the sequence; the keys it hashes stay on the sequence for the admission."""
        return len(self._lookup(seq)) * self.blocks.block_size

    def _lookup(self, seq: Sequence) -> list[int]:
        """Registered blocks that hold the start of `seq`'s tokens, short of its last token. Requests
        whose penalties or prompt logprobs are built from every prompt chunk compute all of it."""
        whole = seq.penalized or seq.params.prompt_logprobs is not None
        if seq.cache_root is None or seq.block_table or whole:
            return []
        usable = (seq.num_tokens - 1) // self.blocks.block_size
        extend_chain(seq.block_keys, seq.cache_root, seq.tokens, self.blocks.block_size, usable)
        return self.blocks.lookup(seq.block_keys[:usable])

    def _admitted(self, seq: Sequence, hits: list[int]) -> None:
        """Take the found blocks; count a request's prompt and hits on its first admission only (a
        preempted sequence finding its own blocks again is not a cached prompt)."""
        if hits:
            seq.block_table = self.blocks.take(hits)
            seq.num_computed = seq.num_registered = len(hits)
            seq.num_computed *= self.blocks.block_size
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = seq.num_computed
            self.num_prompt_tokens += seq.num_prompt
            self.num_cached_tokens += seq.num_computed

    def _register(self, seq: Sequence, computed: int) -> None:
        """Index `seq`'s full blocks among its first `computed` tokens (written by launched steps)
        whose tokens the host knows (not one still in flight)."""
        size = self.blocks.block_size
        full = min(computed, len(seq.tokens)) // size
        if full <= seq.num_registered:
            return
        extend_chain(seq.block_keys, seq.cache_root, seq.tokens, size, full)
        for i in range(seq.num_registered, full):
            self.blocks.register(seq.block_table[i], seq.block_keys[i])
        seq.num_registered = full

    def _make_room(self, seq: Sequence, num_tokens: int) -> bool:
        """Free blocks for `seq` by preempting the lowest tier's latest arrivals (the end of the
        rank-ordered running list, never one this step claimed before `seq`); False if `seq`
        itself was preempted."""
        while not self.blocks.can_allocate(self._blocks_for(seq, num_tokens - seq.num_computed)):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def _make_room_for(self, head: Sequence) -> None:
        """Preempt lower-tier running sequences, lowest tier and latest arrival first, until the
        waiting `head` has a row (and its samples theirs) and the blocks of its first chunk."""
        chunk = min(head.uncomputed(), self.max_num_batched_tokens)
        while self.running and self.running[-1].priority > head.priority:
            if self._has_rows_for(head) and self.blocks.can_allocate(self._blocks_for(head, chunk)):
                return
            self.preempt(self.running[-1])

    def _has_rows_for(self, seq: Sequence) -> bool:
        """A row is free for a waiting `seq` and for each of its samples still to fork."""
        return len(self.running) + self._reserved_rows + 1 + len(seq.forks) <= self.max_num_seqs

    def _claim(self, seq: Sequence, num_new: int) -> ScheduledSeq:
        start = seq.num_computed
        had = len(seq.block_table)
        if seq.cache_root is not None and start >= (seq.num_registered + 1) * self.blocks.block_size:
            self._register(seq, start)  # what earlier steps wrote; this step's blocks wait for the next
        if start + num_new > had * self.blocks.block_size:  # decodes mostly fit their last block
            self.blocks.allocate(seq.block_table, start + num_new)
            seq.block_array[had : len(seq.block_table)] = seq.block_table[had:]
        samples = start + num_new == len(seq.tokens) + seq.num_pending
        prev_row = seq.pending_row if seq.num_pending else -1
        seq.num_computed += num_new
        item = ScheduledSeq(seq, start, num_new, samples, prev_row)
        if samples and seq.forks:
            self._fork(seq)
        return item

    def _fork(self, parent: Sequence) -> None:
        """Start the parent's waiting samples on its prompt's blocks; they draw in this step."""
        full = parent.num_prompt // self.blocks.block_size
        for child in parent.forks:
            self._reserved_rows -= 1
            if child.finished:  # aborted before its prompt was done
                continue
            child.block_table = self.blocks.share(parent.block_table[:full])
            copy = None
            if full < len(parent.block_table):
                self.blocks.allocate(child.block_table, parent.num_prompt)
                copy = (parent.block_table[full], child.block_table[full])
            child.num_computed = parent.num_prompt
            if parent.lora_slot >= 0:  # the sample reads its parent's adapter slot
                self.lora.hold(parent.lora_slot)
                child.lora_slot = parent.lora_slot
            child.num_cached_tokens = parent.num_cached_tokens  # one prompt: the request's figure
            child.status = SeqStatus.RUNNING
            insort(self.running, child, key=RANK)
            self._take_row(child)
            self._forks.append(Fork(parent, child, copy))
        parent.forks = []

    def _plan(self, items: list[ScheduledSeq]) -> StepPlan:
        num_tokens = sum(item.num_new for item in items)
        if num_tokens != len(items):  # some chunks: stable sort puts decodes first, then chunks
            items.sort(key=lambda item: item.num_new > 1)
        num_decode = sum(1 for item in items if item.num_new == 1)
        # A fork preempted in the step that made it would copy into a block it no longer owns.
        forks = [f for f in self._forks if f.child.status is SeqStatus.RUNNING]
        self._forks = []
        plan = StepPlan(self._next_step, items, num_decode, num_tokens, self.block_rows, forks)
        self._next_step += 1
        children: dict[int, list[Sequence]] = {}
        for fork in forks:
            children.setdefault(id(fork.parent), []).append(fork.child)
        row = 0
        for index, item in enumerate(items):
            if not item.samples:
                continue
            for seq in (item.seq, *children.get(id(item.seq), ())):
                seq.num_pending += 1
                seq.pending_row = row
                plan.sample_seqs.append(seq)
                plan.sample_items.append(index)
                row += 1
        return plan

    def preempt(self, seq: Sequence) -> None:
        """Drop `seq`'s cache and send it to the front of the queue; it is recomputed later."""
        self.running.remove(seq)
        self._reserved_rows -= len(seq.forks)  # its forks wait with it (reserved again on admission)
        self._release_row(seq)
        # On resume it may find its own blocks. A sample forked in this very step holds blocks that
        # this step writes: registered now, a later admission in the same step could read them.
        if seq.cache_root is not None and not any(f.child is seq for f in self._forks):
            self._register(seq, seq.num_computed)
        self.blocks.free(seq.block_table)
        self._drop_slot(seq)
        seq.num_computed = seq.num_registered = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        insort(self.waiting, seq, key=RANK)  # ahead of its tier's later arrivals

    def finish(self, seq: Sequence, reason: str) -> None:
        """End `seq` wherever it is and return its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self._reserved_rows -= len(seq.forks)
            self._release_row(seq)
        elif seq.status is SeqStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        failed = reason == "error"  # the step that wrote its blocks may have failed: not to be found
        if seq.cache_root is not None and not failed and seq.block_table:
            self._register(seq, seq.num_computed)
        self.blocks.free(seq.block_table, forget=failed)
        self._drop_slot(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    def _take_slot(self, seq: Sequence) -> bool:
        """Hold a device slot with `seq`'s adapter in it; False while it cannot be had yet."""
        slot = self.lora.acquire(seq.lora)
        if slot is None:
            return False
        seq.lora_slot = slot
        return True

    def _drop_slot(self, seq: Sequence) -> None:
        """Let go of `seq`'s adapter slot (it stays loaded, idle, until evicted)."""
        if seq.lora_slot >= 0:
            self.lora.release(seq.lora_slot)
            seq.lora_slot = -1

    def _take_row(self, seq: Sequence) -> None:
        """Give a newly running sequence its row of `block_rows` (its table is empty or restored)."""
        seq.row = self._free_rows.pop()
        seq.block_array = self.block_rows[seq.row]
        seq.block_array[: len(seq.block_table)] = seq.block_table

    def _release_row(self, seq: Sequence) -> None:
        # Safe at once: a launched step copied its tables into its own IO buffers when it was filled.
        self._free_rows.append(seq.row)
        seq.row, seq.block_array = -1, None
