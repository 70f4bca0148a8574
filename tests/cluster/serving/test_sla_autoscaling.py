"""``autoscaling.policy: sla`` on real Serve with the embedded default model (one app on the session's Ray).

Shares are the guaranteed ones (``share_basis: configured``) of this app's tenancy: alice
(interactive) weighs 8 of the 12 configured, carol (batch) 1, so carol's flood is far beyond her share
and does not buy a replica (the policy keeps deciding to stay at one while it waits); alice's burst,
within hers, then scales 1 → 2. The decision, its reason, the predicted attainment per class and the
replicas' start times are in ``/admin/state`` and ``/metrics``. Once the burst is over the policy
scales 2 → 1 with Serve's graceful drain, while alice keeps a stream open: no stream is cut.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from ray import serve

from tests.cluster.helpers import ADMIN, ALICE, CAROL, MODEL, start_app, wait_until

APP, PREFIX = "fl-sla-scale", "/sla-scale"
FLOOD = 24  # carol's requests at once: ~4× what two replicas serve over the policy's window


@pytest.fixture(scope="module")
def sla_app(ray_serve: int, app_config: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tenancy = yaml.safe_load(Path(app_config["tenancy_config"]).read_text())
    for tenant in tenancy["tenants"]:
        tenant["weight"] = 8.0 if tenant["id"] == "alice" else 1.0
    path = tmp_path_factory.mktemp("sla") / "tenants.yaml"
    path.write_text(yaml.safe_dump(tenancy))
    autoscaling = {
        "min_replicas": 1,
        "max_replicas": 2,
        "upscale_delay_s": 1.0,
        "downscale_delay_s": 10.0,  # Serve's wrapper: 10 s of down decisions in a row before one replica goes
        "metrics_interval_s": 0.5,
        "policy": "sla",
        "sla": {"start_time_s": 15.0, "window_s": 10.0, "horizon_s": 10.0, "share_basis": "configured"},
    }
    config = app_config | {"autoscaling": autoscaling, "replica_num_cpus": 0.5, "tenancy_config": str(path)}
    start_app(APP, PREFIX, config)
    yield f"http://127.0.0.1:{ray_serve}{PREFIX}"
    serve.delete(APP)


def _running() -> int:
    return serve.status().applications[APP].deployments["Replica"].replica_states.get("RUNNING", 0)


def _post(base: str, key: str, max_tokens: int) -> int:
    body = {
        "model": MODEL,
        "prompt": "Tell me a story about a cat.",
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{base}/v1/completions", json=body, headers=headers, timeout=300).status_code


def _model(base: str) -> dict:
    """The model's part of /admin/state ({"error": ...} when the router, busy with the flood, sheds
    the call or fails it)."""
    r = httpx.get(f"{base}/admin/state", headers=ADMIN, timeout=30)
    return r.json()["models"][MODEL] if r.status_code == 200 else {"error": (r.status_code, r.text[:200])}


def _decision(base: str) -> dict | None:
    return _model(base).get("autoscaling")


def test_over_share_batch_backlog_holds_and_an_interactive_burst_scales_up(sla_app: str) -> None:
    assert _running() == 1
    codes: list[int] = []
    flood = [threading.Thread(target=lambda: codes.append(_post(sla_app, CAROL, 48))) for _ in range(FLOOD)]
    for t in flood:
        t.start()
    # The policy decides every half second; watch its decisions until its signals window (10 s) has
    # seen the whole flood, while carol's backlog waits in the queue.
    flooded_at = time.time()
    seen: list[tuple[dict, int]] = []

    def watched() -> bool:
        model = _model(sla_app)
        d = model.get("autoscaling")
        if d is not None and (not seen or d["decided_at"] != seen[-1][0]["decided_at"]):
            seen.append((d, model.get("queued", 0)))
        return len(seen) >= 6 and seen[-1][0]["decided_at"] >= flooded_at + 12

    assert wait_until(watched, timeout_s=120, interval_s=0.5), seen[-1:]
    assert any(queued > 0 for _, queued in seen)  # the backlog waited while the policy decided
    seen_decisions = [d for d, _ in seen]
    assert all(d["desired"] == 1 for d in seen_decisions), [d["reason"] for d in seen_decisions]
    assert _running() == 1
    last = seen_decisions[-1]
    assert last["last_change"] is None  # the policy never moved the count for the over-share flood
    assert set(last["predictions"][0]["attainment"]) >= {"interactive", "batch"}
    assert last["replica_start_s"] and last["replica_hours"] > 0  # start times and cost published

    stop = threading.Event()

    def interactive() -> None:
        while not stop.is_set():
            codes.append(_post(sla_app, ALICE, 24))

    burst = [threading.Thread(target=interactive, daemon=True) for _ in range(4)]
    for t in burst:
        t.start()
    try:
        moved: list[dict] = []  # kept from the poll that saw it: a later /admin/state call may be shed

        polls: list[tuple] = []  # (s since the flood, running, the decision or the error), for the message

        def scaled() -> bool:  # the decision that moved the count, not the holds after it
            model, running = _model(sla_app), _running()
            d = model.get("autoscaling")
            polls.append((round(time.time() - flooded_at, 1), running, d and d["reason"], model.get("error")))
            change = (d or {}).get("last_change") or {}
            if change.get("desired") == 2:
                moved[:] = [change]
            return running == 2 and bool(moved)

        assert wait_until(scaled, timeout_s=180, interval_s=0.5), polls[:3] + polls[-3:]
        change = moved[0]
        assert change["reason"].startswith("up") and "interactive" in change["reason"], change
        metrics = httpx.get(f"{sla_app}/metrics", headers=ADMIN, timeout=10).text
        assert "fairlane_autoscaling_desired_replicas" in metrics
        assert "fairlane_sla_predicted_attainment" in metrics and "fairlane_replica_start_seconds" in metrics
    finally:
        stop.set()
        for t in burst + flood:
            t.join(timeout=300)
    assert codes and all(c == 200 for c in codes), codes


def _stream(base: str, tokens: int) -> tuple[int, str | None]:
    """One streamed chat answer of alice's, read to its end: (completion tokens, finish reason)."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=ALICE, max_retries=0, timeout=300)
    used, finish = 0, None
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
    return used, finish


def test_after_the_burst_it_scales_down_and_the_drain_cuts_no_stream(sla_app: str) -> None:
    assert _running() == 2  # where the burst left it
    stop = threading.Event()
    ended: list[tuple[int, str | None]] = []
    errors: list[BaseException] = []

    def streams() -> None:  # one of alice's streams open at every moment of the scale-down
        while not stop.is_set():
            try:
                ended.append(_stream(sla_app, 32))
            except Exception as exc:  # a cut stream: the check below names it
                errors.append(exc)

    streamer = threading.Thread(target=streams, daemon=True)
    streamer.start()
    moved: list[dict] = []
    try:

        def down() -> bool:
            change = (_decision(sla_app) or {}).get("last_change") or {}
            if change.get("desired") == 1:
                moved[:] = [change]
            return _running() == 1 and bool(moved)

        assert wait_until(down, timeout_s=180, interval_s=0.5), (_running(), _decision(sla_app))
        assert moved[0]["reason"].startswith("down"), moved
        streamed_before = len(ended)
        # The stream open while the replica stopped ends too, and one more after it, on the one left.
        assert wait_until(lambda: len(ended) >= streamed_before + 2 or bool(errors), timeout_s=120)
    finally:
        stop.set()
        streamer.join(timeout=300)
    assert not errors, errors
    assert ended and all(end == (32, "length") for end in ended), ended
