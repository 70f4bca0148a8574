"""The HTTP answer of an open request: a server-sent-event stream, or one JSON body.

A completions batch (``prompt_batch.BatchRequest``) is answered like one request with more choices;
``best_of`` (not streamed) keeps each prompt's ``n`` samples with the highest cumulative logprob,
best first, as vLLM does.
"""

from __future__ import annotations

import asyncio
import logging

import orjson
from fastapi.responses import JSONResponse
from starlette.responses import Response

from cluster.edge.job_builder import JobBuilder
from cluster.edge.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.edge.prompt_batch import BatchRequest
from cluster.edge.responses import (
    ChoiceState,
    ResponseMeta,
    SseRenderer,
    UsageTally,
    choice_states,
    full_body,
)
from cluster.edge.stream_responses import SseResponse
from cluster.edge.tool_answers import ChunkShaper, ToolPlan, tool_plan
from cluster.errors import error_response
from cluster.routing.request_flow import ActiveRequest

log = logging.getLogger(__name__)
Body = CompletionRequest | ChatCompletionRequest
# Outputs that arrive while the loop is busy wait in the stream's queue and are taken without
# suspending: a long answer's burst (n choices, top logprobs) would be one long step of the
# router's loop. A yield every so many outputs bounds it (issue 22); ~10-25 µs an output.
YIELD_EVERY = 16


class FastJSON(JSONResponse):
    """A JSON answer encoded by orjson: a 22 kB body (n = 4, top-5 logprobs) takes ~0.45 ms in
    ``json.dumps`` on the CPU box, several times that less in orjson. Same JSON, but a non-finite
    float becomes null (``json.dumps`` with ``allow_nan=False`` raised: an error answer)."""

    def render(self, content: object) -> bytes:
        return orjson.dumps(content)


async def answer(
    kind: str,
    request_id: str,
    body: Body,
    active: ActiveRequest | BatchRequest,
    jobs: JobBuilder,
    log_text: bool = False,
) -> Response:
    """Stream the request's outputs, or collect them into one body."""
    meta = response_meta(kind, request_id, body, active, jobs)
    headers = dict(active.lease.headers) if active.lease else {}
    samples = body.samples if isinstance(body, CompletionRequest) else body.n
    tools = tool_plan(body, jobs.tool_family) if isinstance(body, ChatCompletionRequest) else None
    if body.stream:
        shape = ChunkShaper(tools) if tools is not None else None
        renderer = SseRenderer(meta, body.include_usage, jobs.encoder.token_text, samples, shape)
        return SseResponse(active, renderer, headers)
    choices = choice_states(meta, jobs.encoder.token_text, samples)
    tally = UsageTally()
    taken = 0
    try:
        async for item in active.outputs():
            choices[item["index"]].add(item)
            tally.add(item)
            taken += 1
            if taken % YIELD_EVERY == 0:
                await asyncio.sleep(0)
    except Exception as exc:
        return error_response(exc)
    if samples > body.n:
        choices = best_choices(choices, samples, body.n)
    if log_text:  # operators only: text stays out of logs by default
        log.info("request %s completion %r", meta.response_id, ["".join(c.text) for c in choices])
    counts = (tally.prompt_tokens, tally.output_tokens, tally.cached_tokens)
    return FastJSON(_with_calls(full_body(meta, choices, *counts), tools), headers=headers)


def _with_calls(body: dict, tools: ToolPlan | None) -> dict:
    return tools.rewrite(body) if tools is not None else body


def response_meta(
    kind: str, request_id: str, body: Body, active: ActiveRequest | BatchRequest, jobs: JobBuilder
) -> ResponseMeta:
    prompt_jobs = active.jobs if isinstance(active, BatchRequest) else [active.job]
    logprobs = body.logprob_count() if isinstance(body, ChatCompletionRequest) else body.logprobs
    echo = None
    if isinstance(body, CompletionRequest) and body.echo:
        echo = tuple(
            (prompt if isinstance(prompt, str) else jobs.encoder.decode(prompt), tuple(job.prompt_ids))
            for prompt, job in zip(body.prompts(), prompt_jobs, strict=True)
        )
    return ResponseMeta.new(
        kind,  # type: ignore[arg-type]
        request_id,
        body.model,  # the served name the request was routed by
        logprobs=logprobs,
        echo=echo,
        continuous_usage=body.continuous_usage,
        prompts=len(prompt_jobs),
    )


def best_choices(choices: list[ChoiceState], samples: int, n: int) -> list[ChoiceState]:
    """Each prompt's ``n`` samples of highest cumulative logprob, best first, renumbered
    prompt × n + rank (ties keep the sampling order)."""
    best: list[ChoiceState] = []
    for start in range(0, len(choices), samples):
        ranked = sorted(choices[start : start + samples], key=lambda c: -c.cumulative_logprob)[:n]
        for rank, choice in enumerate(ranked):
            choice.index = choice.prompt * n + rank
        best += ranked
    return best
