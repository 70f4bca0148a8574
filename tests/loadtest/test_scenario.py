"""Scenario files: shipped ones load and plan; bad ones are refused with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.plan import build_open_plan
from loadtest.prompts import bundled_prompts
from loadtest.scenario import Scenario, ScenarioError, load_scenario, shipped_scenarios

BASE = {
    "name": "t",
    "duration_s": 10,
    "tenants": [{"id": "a", "api_key": "k", "sla_class": "interactive", "rate": 1.0}],
}


def test_the_four_scenarios_ship_and_plan() -> None:
    assert {"steady", "noisy-neighbour", "mixed-sla", "burst"} <= set(shipped_scenarios())
    for name in shipped_scenarios():
        scenario = load_scenario(name)
        plan = build_open_plan(scenario)
        assert plan, name
        assert all(0 <= p.at < scenario.duration_s for p in plan)
        assert [p.at for p in plan] == sorted(p.at for p in plan)


def test_noisy_neighbour_has_one_tenant_at_ten_times_the_others() -> None:
    rates = sorted(t.rate for t in load_scenario("noisy-neighbour").tenants)
    assert rates[-1] >= 10 * rates[0]


def test_bundled_prompts_are_many_and_distinct() -> None:
    prompts = bundled_prompts()
    assert 60 <= len(prompts) <= 100
    assert len(set(prompts)) == len(prompts)


def test_unknown_keys_and_bad_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="extra"):
        Scenario.model_validate(BASE | {"durations": 3})
    tenant = BASE["tenants"][0]
    with pytest.raises(ValueError, match="exactly one of rate or concurrency"):
        Scenario.model_validate(BASE | {"tenants": [tenant | {"concurrency": 2}]})
    with pytest.raises(ValueError, match="unknown SLA class 'gold'"):
        Scenario.model_validate(BASE | {"tenants": [tenant | {"sla_class": "gold"}]})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nduration_s: -1\ntenants: []\n")
    with pytest.raises(ScenarioError, match="duration_s"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="shipped"):
        load_scenario("no-such-scenario")


def test_scaled_multiplies_load_and_keeps_warmup_share() -> None:
    s = load_scenario("burst")
    small = s.scaled(0.5, duration_s=12)
    assert small.duration_s == 12
    assert small.warmup_s == pytest.approx(s.warmup_s * 12 / s.duration_s)
    by_id = {t.id: t for t in small.tenants}
    assert by_id["bob"].rate == pytest.approx(1.5)
    assert by_id["carol"].concurrency == 1  # ceil(1 × 0.5), never 0
    with pytest.raises(ValueError):
        s.scaled(0)


def test_requests_carry_the_sampling_mix_unless_greedy_is_pinned() -> None:
    from loadtest.client import request_body
    from loadtest.plan import ClosedLoopSource

    scenario = load_scenario("steady")
    assert scenario.sampling == "mix"
    plan = build_open_plan(scenario.scaled(4.0))
    sampled = [p for p in plan if p.sampling["temperature"] > 0]
    assert 0.7 < len(sampled) / len(plan) < 0.9  # 80% sampled, 20% greedy
    assert all(0.6 <= p.sampling["temperature"] <= 1.0 and "seed" in p.sampling for p in sampled)
    assert any("top_k" in p.sampling for p in sampled) and any("min_p" in p.sampling for p in sampled)
    assert build_open_plan(scenario.scaled(4.0)) == plan  # the same seed, the same draws
    body = request_body("chat", "m", "hi", 8, sampled[0].sampling)
    assert body["temperature"] == sampled[0].sampling["temperature"] and body["stream"]
    greedy = Scenario.model_validate(scenario.model_dump() | {"sampling": "greedy"})
    assert all(p.sampling == {"temperature": 0.0} for p in build_open_plan(greedy))
    pinned = greedy.tenants[0].model_copy(update={"sampling": "mix"})
    draws = [ClosedLoopSource(pinned, 1, greedy.sampling_of(pinned)).next().sampling for _ in range(1)]
    assert greedy.sampling_of(pinned) == "mix" and draws


def test_a_tenant_sends_only_within_its_window_and_the_window_scales_with_the_run() -> None:
    burst = BASE["tenants"][0] | {"id": "dave", "rate": 20.0, "start_s": 4.0, "end_s": 7.0}
    scenario = Scenario.model_validate(BASE | {"duration_s": 10, "tenants": [BASE["tenants"][0], burst]})
    times = [p.at for p in build_open_plan(scenario) if p.tenant == "dave"]
    assert len(times) > 30 and min(times) >= 4.0 and max(times) < 7.0  # ~60 at 20/s over 3 s
    stretched = [p.at for p in build_open_plan(scenario.scaled(1.0, duration_s=20)) if p.tenant == "dave"]
    assert min(stretched) >= 8.0 and max(stretched) < 14.0
    with pytest.raises(ValueError, match="open-loop"):
        Scenario.model_validate(
            BASE | {"tenants": [BASE["tenants"][0] | {"rate": None, "concurrency": 2, "start_s": 1}]}
        )
    with pytest.raises(ValueError, match="after start_s"):
        Scenario.model_validate(BASE | {"tenants": [burst | {"end_s": 3.0}]})
