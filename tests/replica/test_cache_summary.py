"""The replica's cache summary: a Bloom filter over registered block keys that routers query by chain."""

from __future__ import annotations

import os

from replica.block_manager import BlockManager
from replica.cache_summary import MAX_BYTES, CacheSummary, SummaryReader, build_summary
from replica.prefix_cache import chain_root, extend_chain


def chain(scope: str, tokens: list[int], blocks: int) -> list[bytes]:
    keys: list[bytes] = []
    extend_chain(keys, chain_root("m", scope), tokens, 16, blocks)
    return keys


def registered(manager: BlockManager, keys: list[bytes]) -> None:
    table: list[int] = []
    manager.allocate(table, len(keys) * 16)
    for block, key in zip(table, keys, strict=True):
        manager.register(block, key)
    manager.free(table)  # freed registered blocks stay indexed: the summary still lists them


def test_a_registered_chain_is_found_up_to_its_length_and_another_scope_finds_nothing():
    manager = BlockManager(num_blocks=64, block_size=16)
    tokens = list(range(200))
    registered(manager, chain("tenant-a", tokens, 8))
    reader = SummaryReader(build_summary(manager.cached_keys(), "m", 16))
    assert reader.leading_blocks(chain("tenant-a", tokens, 12)) == 8  # 4 more blocks the replica lacks
    assert reader.leading_blocks(chain("tenant-a", tokens, 5)) == 5
    assert reader.leading_blocks(chain("tenant-b", tokens, 12)) == 0  # same tokens, other scope
    assert reader.leading_blocks(chain("tenant-a", [7, *tokens[1:]], 12)) == 0  # first block differs


def test_leading_blocks_stop_at_the_first_missing_block():
    manager = BlockManager(num_blocks=64, block_size=16)
    keys = chain("t", list(range(160)), 10)
    registered(manager, keys[:3] + keys[5:])  # blocks 3 and 4 evicted
    reader = SummaryReader(build_summary(manager.cached_keys(), "m", 16))
    assert reader.leading_blocks(keys) == 3


def test_an_empty_cache_matches_nothing():
    reader = SummaryReader(build_summary([], "m", 16))
    assert reader.leading_blocks(chain("t", list(range(64)), 4)) == 0


def test_false_positives_stay_near_one_percent_at_8b_scale_and_the_size_is_bounded():
    keys = [os.urandom(16) for _ in range(54_067)]  # an 8B replica's KV blocks on an H200
    summary = build_summary(keys, "m", 16)
    assert len(summary.bits) <= 70_000
    reader = SummaryReader(summary)
    assert all(reader.leading_blocks([k]) == 1 for k in keys[:2000])  # no false negatives
    strangers = [os.urandom(16) for _ in range(20_000)]
    false_hits = sum(reader.leading_blocks([k]) for k in strangers)
    assert false_hits / len(strangers) < 0.015
    huge = build_summary(keys * 4, "m", 16)  # more keys than the bound holds at 10 bits each
    assert len(huge.bits) == MAX_BYTES


def test_a_summary_survives_the_trip_as_a_dict():
    summary = build_summary(chain("t", list(range(64)), 4), "model|False|0", 16)
    again = CacheSummary.from_dict(summary.as_dict())
    assert again == summary


def test_the_one_key_check_agrees_with_the_vectorized_probes():
    keys = [os.urandom(16) for _ in range(3000)]
    reader = SummaryReader(build_summary(keys, "m", 16))
    for key in keys[:300] + [os.urandom(16) for _ in range(5000)]:
        assert reader.leading_blocks([key, key]) in (0, 2)  # the vectorized path, past the first key
        assert (reader.leading_blocks([key]) == 1) == reader._has(key)
