"""Prefix caching's bookkeeping without a model: chain keys, LRU eviction of unheld blocks only,
and admission taking the longest cached run of full blocks (never the last token)."""

from __future__ import annotations

from replica import SamplingParams
from replica.block_manager import BlockManager
from replica.prefix_cache import chain_root, extend_chain
from replica.scheduler import Scheduler
from replica.sequence import Sequence

ROOT = chain_root("m", "tenant-a")


def _seq(rid: str, tokens: list[int], root: bytes | None = ROOT, **params) -> Sequence:
    p = SamplingParams(max_tokens=4, **params)
    return Sequence(rid, list(tokens), len(tokens), p, 0, 0.0, 4096, cache_root=root)


def _keys(root: bytes, tokens: list[int], size: int = 4) -> list[bytes]:
    keys: list[bytes] = []
    extend_chain(keys, root, tokens, size, len(tokens) // size)
    return keys


def test_keys_chain_over_blocks_and_roots():
    a = _keys(ROOT, list(range(12)))
    assert len(a) == 3 and len(set(a)) == 3
    assert _keys(ROOT, [*range(8), 0, 0, 0, 0])[:2] == a[:2]  # a shared start shares keys
    assert _keys(ROOT, [9, *range(1, 12)])[1] != a[1]  # a key depends on every block before it
    for other in (chain_root("m", "tenant-b"), chain_root("other-model", "tenant-a")):
        assert not set(_keys(other, list(range(12)))) & set(a)


def _registered(bm: BlockManager, count: int, tag: int) -> tuple[list[int], list[bytes]]:
    table: list[int] = []
    bm.allocate(table, count * 4)
    keys = _keys(ROOT, [tag] * (count * 4))
    for block, key in zip(table, keys, strict=True):
        bm.register(block, key)
    return table, keys


def test_freed_registered_blocks_stay_findable_until_evicted_least_recent_first():
    bm = BlockManager(num_blocks=7, block_size=4)  # 6 usable
    a, a_keys = _registered(bm, 2, tag=1)
    b, b_keys = _registered(bm, 2, tag=2)
    held, _ = _registered(bm, 2, tag=3)
    a_blocks, b_blocks = list(a), list(b)
    bm.free(a)  # freed first: evicted first
    bm.free(b)
    assert bm.num_free == 4 and bm.num_cached == 6
    assert bm.lookup(a_keys) == a_blocks and bm.lookup(b_keys) == b_blocks
    fresh: list[int] = []
    bm.allocate(fresh, 8)  # two blocks: no plain free block left, so a's go
    assert sorted(fresh) == sorted(a_blocks) and bm.num_evictions == 2
    assert bm.lookup(a_keys) == [] and bm.lookup(b_keys) == b_blocks
    bm.allocate(fresh, 16)  # b's go too; the held blocks are never candidates
    assert bm.num_evictions == 4 and not set(fresh) & set(held) and bm.num_free == 0
    assert bm.num_cached == 2  # the held table's blocks are still indexed


def test_taking_a_hit_off_the_free_list_and_sharing_a_held_one():
    bm = BlockManager(num_blocks=5, block_size=4)
    a, keys = _registered(bm, 2, tag=1)
    blocks = list(a)
    hit = bm.take(bm.lookup(keys))  # held by a and the hit
    assert hit == blocks and bm.unheld(blocks) == 0
    bm.free(a)
    assert bm.num_free == 2  # the hit still holds both
    bm.free(hit)
    assert bm.num_free == 4 and bm.unheld(blocks) == 2
    again = bm.take(bm.lookup(keys))
    assert again == blocks and bm.num_free == 2


def test_plain_free_blocks_go_before_cached_ones_and_forget_unindexes():
    bm = BlockManager(num_blocks=6, block_size=4)
    a, keys = _registered(bm, 2, tag=1)
    bm.free(a)
    table: list[int] = []
    bm.allocate(table, 12)  # three plain blocks are free: nothing is evicted
    assert bm.num_evictions == 0 and len(bm.lookup(keys)) == 2
    b = bm.take(bm.lookup(keys))
    bm.free(b, forget=True)
    assert bm.lookup(keys) == [] and bm.num_free == 2


def test_admission_takes_the_cached_run_but_computes_the_last_token():
    size = 4
    sched = Scheduler(BlockManager(32, size), max_num_seqs=8, max_num_batched_tokens=64)
    prompt = list(range(1, 13))  # three full blocks
    first = _seq("a", prompt)
    sched.add(first)
    sched.schedule()
    first.tokens.append(50)
    first.num_pending = 0
    sched.finish(first, "stop")  # registers its three full blocks
    assert sched.blocks.num_cached == 3
    same = _seq("b", prompt)
    longer = _seq("c", [*prompt, 7, 7])
    other_tenant = _seq("d", prompt, root=chain_root("m", "tenant-b"))
    off = _seq("e", prompt, root=None)
    penalized = _seq("f", prompt, repetition_penalty=1.2)
    for seq in (same, longer, other_tenant, off, penalized):
        sched.add(seq)
    plan = sched.schedule()
    new = {item.seq.request_id: (item.start, item.num_new) for item in plan.items}
    assert new == {"b": (8, 4), "c": (12, 2), "d": (0, 12), "e": (0, 12), "f": (0, 12)}
    assert [s.num_cached_tokens for s in (same, longer, other_tenant, off, penalized)] == [8, 12, 0, 0, 0]
    assert same.block_table[:2] == longer.block_table[:2]
    assert sched.num_prompt_tokens == 12 * 5 + 14 and sched.num_cached_tokens == 20


def test_a_preempted_sequence_finds_its_own_blocks_again():
    sched = Scheduler(BlockManager(6, 4), max_num_seqs=8, max_num_batched_tokens=64)
    first, second = _seq("a", list(range(1, 9))), _seq("b", list(range(101, 109)))
    sched.add(first)
    sched.add(second)
    sched.schedule()
    for seq in (first, second):
        seq.tokens.append(7)
        seq.num_pending = 0
    sched.schedule()  # a's next token needs a third block... fits; b's too
    for seq in (first, second):
        seq.tokens += [7, 7, 7]
        seq.num_computed = len(seq.tokens) - 1
    sched.schedule()  # both need a fourth block: none free, b is preempted
    assert second.num_preemptions == 1 and second.block_table == []
    sched.finish(first, "stop")
    plan = sched.schedule()
    item = next(i for i in plan.items if i.seq is second)
    assert item.start == 8 and second.num_cached_tokens == 0  # its own blocks: not a cached prompt
