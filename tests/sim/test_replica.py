"""The simulated replica against hand-computed step timelines."""

from __future__ import annotations

import pytest

from loadtest.sim.events import EventLoop
from loadtest.sim.replica import Job, ReplicaSpec, SimReplica
from loadtest.sim.step_model import StepModel


def _replica(step: StepModel, **kw) -> tuple[EventLoop, SimReplica, dict[int, tuple[float, float]]]:
    loop, done = EventLoop(), {}
    spec = ReplicaSpec(step, kw.pop("kv_blocks", 1000), 16, kw.pop("max_num_seqs", 64), kw.pop("budget", 512))
    r = SimReplica(0, spec, loop, lambda job, now: done.__setitem__(job.rid, (job.first_token, now)))
    return loop, r, done


def test_single_request_prefill_then_one_token_per_step(flat_10ms):
    loop, r, done = _replica(flat_10ms)
    loop.at(0.0, r.submit, Job(1, 16, 5))
    loop.run()
    first, end = done[1]
    assert first == pytest.approx(0.010)  # the prefill step samples the first token
    assert end == pytest.approx(0.050)  # four more decode steps
    assert r.ongoing == 0 and r.free_blocks == 1000


def test_request_arriving_mid_step_joins_at_the_next_boundary(flat_10ms):
    loop, r, done = _replica(flat_10ms)
    loop.at(0.0, r.submit, Job(1, 16, 10))
    loop.at(0.025, r.submit, Job(2, 16, 3))
    loop.run()
    # job 2 waits for the step ending at 0.03, is prefilled in the step ending at 0.04
    assert done[2] == (pytest.approx(0.040), pytest.approx(0.060))
    # job 1: first token 0.01 (step 1); steps 2..10 end at 0.02 .. 0.10 (the prefill step decodes it too)
    assert done[1] == (pytest.approx(0.010), pytest.approx(0.100))


def test_sequence_cap_makes_the_second_request_wait_for_the_first(flat_10ms):
    loop, r, done = _replica(flat_10ms, max_num_seqs=1)
    loop.at(0.0, r.submit, Job(1, 16, 3))
    loop.at(0.0, r.submit, Job(2, 16, 2))
    loop.run()
    assert done[1] == (pytest.approx(0.01), pytest.approx(0.03))
    assert done[2] == (pytest.approx(0.04), pytest.approx(0.05))


def test_kv_blocks_limit_admission(flat_10ms):
    loop, r, done = _replica(flat_10ms, kv_blocks=3)  # 3 × 16 tokens
    loop.at(0.0, r.submit, Job(1, 30, 2))  # 2 blocks
    loop.at(0.0, r.submit, Job(2, 30, 2))  # 2 more: must wait
    loop.run()
    assert done[2][0] == pytest.approx(done[1][1] + 0.01)


def test_long_prompt_is_prefilled_in_chunks_of_the_token_budget(flat_10ms):
    loop, r, done = _replica(flat_10ms, budget=100)
    loop.at(0.0, r.submit, Job(1, 250, 1))  # ceil(250 / 100) = 3 prefill steps
    loop.run()
    assert done[1] == (pytest.approx(0.03), pytest.approx(0.03))


def test_closed_form_stretch_equals_the_sum_of_its_steps():
    step = StepModel(5.0, 0.5, 0.0, 0.01)
    _loop, r, _ = _replica(step)
    r.batch, r.kc, r.s0 = 3, 300, 7
    by_hand = sum(step.step_ms(3, 0, 300 + 3 * s) for s in range(7, 7 + 12)) / 1000
    assert r._elapsed(12) == pytest.approx(by_hand)
    assert r._steps_until(by_hand - 1e-6) == 12
    assert r._steps_until(by_hand + 1e-6) == 13


def test_context_cost_slows_later_steps():
    step = StepModel(10.0, 0.0, 0.0, 0.1)  # +0.1 ms per context token
    loop, r, done = _replica(step)
    loop.at(0.0, r.submit, Job(1, 100, 3))
    loop.run()
    # prefill 10 + 0.1·0 (context before the step) ... then decode at context 101, 102
    prefill = 10.0
    decode = (10 + 0.1 * 101) + (10 + 0.1 * 102)
    assert done[1][1] == pytest.approx((prefill + decode) / 1000)
