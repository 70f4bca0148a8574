"""Real OpenAI clients against the embedded default, as a new user would point them at fairlane.

* ``guidellm`` 0.8.1 runs a 20-second synthetic benchmark (chat, streamed, ``ignore_eos``,
  ``continuous_usage_stats``, text content parts: everything it sends) with no error, and its
  request and token counts equal what the cluster's SLA report and timing records say for the tenant.
* ``langchain-openai``'s ``ChatOpenAI``: plain chat and streaming give the ``openai`` client's answer.

Kept light for a 2-core box: one request a second, 16-token prompts, 8-token answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai

from cluster.text.prompts import tokenizer_dir
from tests.cluster.helpers import ADMIN, CAROL, MODEL

SECONDS = 20
PROMPT_TOKENS, OUTPUT_TOKENS = 16, 8
QUESTION = [("system", "Answer in one short sentence."), ("human", "What is the capital of France?")]


def _tenant_totals(base_url: str, tenant: str) -> dict:
    """The SLA report's counts for the tenant, its records' prompt tokens and how the others ended."""
    report = httpx.get(f"{base_url}/admin/sla", headers=ADMIN, timeout=30).json()
    group = next((g for g in report["tenants"] if g["tenant_id"] == tenant), None)
    records = httpx.get(f"{base_url}/admin/timings", headers=ADMIN, timeout=30).json()["records"]
    ok = [r for r in records if r["tenant_id"] == tenant and r["outcome"] == "ok"]
    keys = ("requests", "ok", "rejected", "failed", "output_tokens")
    totals = {k: group[k] if group else 0 for k in keys}
    totals["prompt_tokens"] = sum(r["prompt_tokens"] for r in ok)
    totals["not_ok"] = {
        r["request_id"]: (r["outcome"], r["reason"]) for r in records if r["tenant_id"] == tenant
    }
    totals["not_ok"] = {k: v for k, v in totals["not_ok"].items() if v[0] != "ok"}
    return totals


def _guidellm(base_url: str, out: Path) -> None:
    backend = f"kind=openai_http,target={base_url},model={MODEL},api_key={CAROL}"
    cmd = [
        *(sys.executable, "-m", "guidellm", "run"),
        *("--backend", backend),
        *("--profile", "kind=constant,rate=1,max_concurrency=2"),
        *("--constraint", f"kind=max_duration,seconds={SECONDS}"),
        *("--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}"),
        *("--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir(MODEL)}"),
        *("--output", f"kind=json,path={out}"),
        "--disable-console-interactive",
    ]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SECONDS + 240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_guidellm_benchmark_has_no_errors_and_agrees_with_the_sla_report(base_url: str, tmp_path: Path):
    before = _tenant_totals(base_url, "carol")
    out = tmp_path / "benchmarks.json"
    _guidellm(base_url, out)
    after = _tenant_totals(base_url, "carol")
    delta = {k: after[k] - before[k] for k in after if k != "not_ok"}
    ended_early = [v for k, v in after["not_ok"].items() if k not in before["not_ok"]]
    bench = json.loads(out.read_text())["benchmarks"][0]
    counts = _request_counts(bench)
    assert counts["errored"] == 0, counts
    assert counts["successful"] >= SECONDS // 2, counts  # ~1 a second ran, and succeeded
    assert delta["ok"] == counts["successful"], (delta, counts)
    # What did not finish was cut by guidellm at the end of its window, a client gone and nothing
    # else; at most its concurrency on each side (guidellm counts a request it cancels before sending
    # as incomplete, and may drop one the server had started from its counts).
    assert delta["rejected"] == 0 and set(ended_early) <= {("aborted", "client_gone")}, ended_early
    assert delta["failed"] == len(ended_early) <= 2 and counts["incomplete"] <= 2, (delta, counts)
    tokens = _token_totals(bench)
    assert delta["output_tokens"] == tokens["output"] == counts["successful"] * OUTPUT_TOKENS, (delta, tokens)
    assert delta["prompt_tokens"] == tokens["prompt"], (delta, tokens)


def _request_counts(bench: dict) -> dict[str, int]:
    totals = bench["metrics"]["request_totals"]
    return {k: int(totals[k]) for k in ("successful", "incomplete", "errored")}


def _token_totals(bench: dict) -> dict[str, int]:
    metrics = bench["metrics"]
    return {
        "prompt": int(metrics["prompt_token_count"]["successful"]["total_sum"]),
        "output": int(metrics["output_token_count"]["successful"]["total_sum"]),
    }


def test_langchain_chat_openai_plain_and_streamed(base_url: str, client: openai.OpenAI) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=f"{base_url}/v1", api_key=CAROL, model=MODEL, temperature=0, max_tokens=8, max_retries=0
    )
    reply = llm.invoke(QUESTION)
    roles = {"system": "system", "human": "user"}
    messages = [{"role": roles[r], "content": c} for r, c in QUESTION]
    sdk = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8)
    assert reply.content == sdk.choices[0].message.content
    assert reply.usage_metadata["output_tokens"] == sdk.usage.completion_tokens
    chunks = list(llm.stream(QUESTION, stream_usage=True))
    assert "".join(c.content for c in chunks) == reply.content
    usage = [c.usage_metadata for c in chunks if c.usage_metadata]
    assert usage and usage[-1]["output_tokens"] == sdk.usage.completion_tokens
