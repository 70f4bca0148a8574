"""From a validated OpenAI body to a ``Job``: model check, tokenization, context and sampling limits.

Everything here runs before admission, so a refusal (400/404) reserves no quota.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cluster.config import AppConfig
from cluster.errors import BadRequest, NotFound
from cluster.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.prompts import PromptEncoder
from cluster.request_flow import Job
from replica import SamplingParams
from tenancy import Tenant

NON_STREAM_COALESCE_S = 0.05  # outputs of a non-streamed request travel in 50 ms batches


class JobBuilder:
    """Builds jobs for one router; ``max_model_len`` asks a replica once and is cached."""

    def __init__(
        self, cfg: AppConfig, encoder: PromptEncoder, max_model_len: Callable[[], Awaitable[int]]
    ) -> None:
        self._cfg = cfg
        self._encoder = encoder
        self._fetch_len = max_model_len
        self._max_model_len: int | None = None

    async def build(
        self, request_id: str, tenant: Tenant, body: CompletionRequest | ChatCompletionRequest
    ) -> Job:
        if body.model != self._cfg.served_model_name:
            raise NotFound(f"the model {body.model!r} does not exist", code="model_not_found", param="model")
        if isinstance(body, ChatCompletionRequest):
            ids = self._encoder.chat(body.template_messages())
            max_tokens = body.output_limit()
        else:
            try:
                prompt = body.single_prompt()
            except ValueError as exc:
                raise BadRequest(str(exc), param="prompt") from None
            ids = self._encoder.completion(prompt)
            max_tokens = body.max_tokens
        max_tokens = max_tokens or self._cfg.default_max_tokens
        await self._check_context(len(ids), max_tokens)
        sampling = {
            "max_tokens": max_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "seed": body.seed,
            "stop": body.stop_tuple(),
        }
        try:
            SamplingParams(**sampling)  # validate here: a bad value is a 400 before any quota is taken
        except (ValueError, TypeError, OverflowError) as exc:
            raise BadRequest(str(exc)) from None
        coalesce = self._cfg.stream_interval_s if body.stream else NON_STREAM_COALESCE_S
        return Job(request_id, tenant, tenant.sla_class, ids, sampling, coalesce)

    async def _check_context(self, prompt_tokens: int, max_tokens: int) -> None:
        if self._max_model_len is None:
            self._max_model_len = await self._fetch_len()
        limit = self._max_model_len
        if prompt_tokens + max_tokens > limit:
            raise BadRequest(
                f"this model's maximum context length is {limit} tokens; the request asks for "
                f"{prompt_tokens + max_tokens} ({prompt_tokens} in the prompt, {max_tokens} to generate)",
                code="context_length_exceeded",
                param="prompt",
            )
