"""The simulator's prefix cache: an LRU of block keys per replica, prefill cut by cached tokens, and the
router's load/prefix choice over simulated replicas."""

from __future__ import annotations

from loadtest.sim.chat_scenario import ChatRun, chains_for, make_conversations, parse_args
from loadtest.sim.events import EventLoop
from loadtest.sim.prefix_cache_sim import BlockLRU, CachingReplica, ChatChains, PrefixChoice
from loadtest.sim.replica import Job, ReplicaSpec
from loadtest.sim.step_model import StepModel

STEP = StepModel(a=5.0, b=0.0, c=0.1, d=0.0)


def test_the_lru_evicts_least_recently_used_and_leading_stops_at_a_gap():
    lru = BlockLRU(capacity=4)
    lru.touch([1, 2, 3], now=0.0)
    lru.touch([1], now=1.0)  # 1 is now the most recent
    lru.touch([4, 5], now=2.0)  # 5 keys: 2 (least recent) goes
    assert lru.evictions == 1
    assert lru.leading([1, 2, 3]) == 1
    assert lru.leading([4, 5]) == 2
    assert lru.leading([4, 5], as_of=1.0) == 0  # a report made at 1.0 did not show them yet


def _first_token(replica: CachingReplica, loop: EventLoop, job: Job, chains: ChatChains) -> float:
    started = loop.now
    replica.submit_chat(job, chains)
    loop.run()
    return job.first_token - started


def test_a_repeated_prefix_is_found_and_its_prefill_skipped():
    loop = EventLoop()
    replica = CachingReplica(0, ReplicaSpec(STEP, kv_blocks=1000), loop, lambda job, now: None)
    chains = chains_for(conv_owner=10, tenant_owner=1, system=1600, prompt=1700, answer=20)
    cold = _first_token(replica, loop, Job(0, 1700, 20), chains)
    again = Job(1, 1700, 20)
    warm = _first_token(replica, loop, again, chains)
    assert again.cached == (1700 - 1) // 16 * 16  # every full block short of the last token
    assert warm < cold / 10  # 1,700 tokens at 0.1 ms against 4


def test_prefix_choice_prefers_the_holder_and_load_choice_does_not():
    loop = EventLoop()
    replicas = [
        CachingReplica(i, ReplicaSpec(STEP, kv_blocks=1000), loop, lambda job, now: None) for i in range(3)
    ]
    chains = chains_for(conv_owner=10, tenant_owner=1, system=1600, prompt=1700, answer=20)
    replicas[2].cache.touch(chains.prompt, now=0.0)
    for mode, expected in (("prefix", 2), ("load", 0)):
        choice = PrefixChoice(mode)
        choice.refresh(replicas, now=1.0)
        assert choice.choose(replicas, Job(0, 1700, 20), chains, room=4, now=1.0).index == expected


def test_a_burst_spreads_by_the_tokens_sent_since_the_report():
    loop = EventLoop()
    replicas = [
        CachingReplica(i, ReplicaSpec(STEP, kv_blocks=1000), loop, lambda job, now: None) for i in range(4)
    ]
    choice = PrefixChoice("load")
    choice.refresh(replicas, now=0.0)
    picked = []
    for rid in range(8):
        chains = chains_for(conv_owner=100 + rid, tenant_owner=rid, system=64, prompt=200, answer=10)
        picked.append(choice.choose(replicas, Job(rid, 200, 10), chains, room=99, now=0.0).index)
    assert sorted(picked) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_on_multi_turn_chat_prefix_choice_hits_more_and_answers_sooner():
    args = parse_args(
        ["--replicas", "4", "--tenants", "8", "--rate", "2", "--duration-s", "40", "--warmup-s", "5"]
    )
    convs = make_conversations(args)
    load, prefix = (ChatRun(args, mode, convs).run() for mode in ("load", "prefix"))
    assert load["requests"] == prefix["requests"] > 100
    assert prefix["hit_rate"] > load["hit_rate"] + 0.05
    assert prefix["hit_rate"] > 0.9
    assert prefix["ttft_p50_s"] < load["ttft_p50_s"]
