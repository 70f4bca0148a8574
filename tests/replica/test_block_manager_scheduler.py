"""Block manager and scheduler rules, without a model."""

from __future__ import annotations

from replica import SamplingParams
from replica.block_manager import BlockManager
from replica.scheduler import Scheduler
from replica.sequence import SeqStatus, Sequence


def _seq(rid: str, prompt_len: int, max_tokens: int = 8) -> Sequence:
    return Sequence(
        rid, list(range(1, prompt_len + 1)), prompt_len, SamplingParams(max_tokens=max_tokens), 0, 0.0, 4096
    )


def test_blocks_allocate_and_free():
    bm = BlockManager(num_blocks=5, block_size=4)
    table: list[int] = []
    assert bm.blocks_needed(table, 9) == 3
    bm.allocate(table, 9)
    assert len(table) == 3 and bm.NULL_BLOCK not in table and bm.num_free == 1
    assert not bm.can_allocate(2)
    bm.free(table)
    assert table == [] and bm.num_free == 4 and bm.num_used == 0


def test_chunked_prefill_within_budget_and_mixed_with_decode():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=10)
    short, long = _seq("a", 3), _seq("b", 25)
    sched.add(short)
    sched.add(long)
    plan = sched.schedule()
    assert [(i.seq.request_id, i.num_new, i.samples) for i in plan.items] == [("a", 3, True), ("b", 7, False)]
    short.tokens.append(99)  # step read back (sync mode)
    short.num_pending = 0
    plan = sched.schedule()
    assert plan.num_decode == 1 and plan.num_tokens == 10
    assert [(i.seq.request_id, i.num_new) for i in plan.items] == [("a", 1), ("b", 9)]


def test_out_of_blocks_preempts_latest_arrival():
    sched = Scheduler(BlockManager(5, 4), max_num_seqs=8, max_num_batched_tokens=64)
    first, second = _seq("a", 8), _seq("b", 8)
    sched.add(first)
    sched.add(second)
    sched.schedule()
    for seq in (first, second):
        seq.tokens.append(7)
        seq.num_pending = 0
    plan = sched.schedule()  # both need a third block; only one block... none free: b is preempted
    assert [i.seq.request_id for i in plan.items] == ["a"]
    assert second.status is SeqStatus.WAITING and second.num_computed == 0 and second.block_table == []
    assert sched.num_preemptions == 1 and sched.waiting[0] is second


def test_length_limit_stops_scheduling():
    sched = Scheduler(BlockManager(16, 4), max_num_seqs=8, max_num_batched_tokens=64)
    seq = _seq("a", 4, max_tokens=1)
    sched.add(seq)
    assert sched.schedule() is not None
    assert seq.num_pending == 1 and seq.reached_length_limit()
    assert sched.schedule() is None  # nothing more to draw until the pending token is read


def test_prompt_that_fits_a_step_whole_waits_instead_of_splitting():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=10)
    first, second, third = _seq("a", 6), _seq("b", 6), _seq("c", 3)
    for seq in (first, second, third):
        sched.add(seq)
    plan = sched.schedule()  # b would be split 4 + 2 behind a's chunk: it waits, and c waits behind it
    assert [(i.seq.request_id, i.num_new) for i in plan.items] == [("a", 6)]
    first.tokens.append(99)
    first.num_pending = 0
    plan = sched.schedule()
    assert [(i.seq.request_id, i.num_new) for i in plan.items] == [("a", 1), ("b", 6), ("c", 3)]


def test_prompt_is_split_when_only_decodes_share_the_step():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=10)
    first, second = _seq("a", 3), _seq("b", 10)
    sched.add(first)
    sched.schedule()
    first.tokens.append(99)
    first.num_pending = 0
    sched.add(second)
    plan = sched.schedule()  # a decode beside it: b would never fit whole, so it is chunked now
    assert [(i.seq.request_id, i.num_new) for i in plan.items] == [("a", 1), ("b", 9)]


def test_without_keep_prompts_whole_a_prompt_fills_the_step_behind_a_chunk():
    sched = Scheduler(BlockManager(64, 4), 8, max_num_batched_tokens=10, keep_prompts_whole=False)
    for seq in (_seq("a", 6), _seq("b", 6), _seq("c", 3)):
        sched.add(seq)
    plan = sched.schedule()  # the budget is filled: b's first 4 tokens ride behind a's chunk
    assert [(i.seq.request_id, i.num_new) for i in plan.items] == [("a", 6), ("b", 4)]
