"""From a validated OpenAI body to a ``Job``: model check, tokenization, context and sampling limits.

Everything here runs before admission, so a refusal (400/404) reserves no quota.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace

from cluster.config import AppConfig
from cluster.edge.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.edge.response_format import check_grammar
from cluster.edge.tool_grammar import check_tool_request, tool_grammar
from cluster.errors import BadRequest, NotFound
from cluster.routing.adapter_registry import Adapter
from cluster.routing.request_job import Job
from cluster.text.prompts import PromptEncoder
from cluster.text.tool_parsers import Family
from replica import SamplingParams
from tenancy import Tenant

NON_STREAM_COALESCE_S = 0.05  # outputs of a non-streamed request travel in 50 ms batches
# Shorter text is templated and tokenized on the event loop (SmolLM2's tokenizer on the CPU box:
# 0.25 ms for 1,000 characters, 0.9 ms for 3,900); longer text on a worker thread.
INLINE_CHARS = 1024


class JobBuilder:
    """Builds jobs for one router; ``max_model_len`` asks a replica once and is cached."""

    def __init__(
        self,
        cfg: AppConfig,
        encoder: PromptEncoder,
        max_model_len: Callable[[], Awaitable[int]],
        tool_parser: str = "auto",
    ) -> None:
        self._cfg = cfg
        self._encoder = encoder
        # The parser family of the model's tool calls: configured, or guessed from its template.
        self.tool_family: Family = encoder.tool_family(tool_parser)
        self._fetch_len = max_model_len
        self._max_model_len: int | None = None

    async def build(
        self,
        request_id: str,
        tenant: Tenant,
        body: CompletionRequest | ChatCompletionRequest,
        adapter: Adapter | None = None,
    ) -> Job:
        """The job of a request with one prompt (a chat, or a completion of one prompt)."""
        jobs = await self.build_all(request_id, tenant, body, adapter)
        if len(jobs) != 1:
            raise BadRequest("this request has several prompts", param="prompt")
        return jobs[0]

    async def build_all(
        self,
        request_id: str,
        tenant: Tenant,
        body: CompletionRequest | ChatCompletionRequest,
        adapter: Adapter | None = None,
    ) -> list[Job]:
        """One job per prompt: a completions batch is served as separate requests (each admitted,
        queued and charged on its own), answered together; a batch of one keeps the request's id.
        ``adapter``: the LoRA adapter the request's ``model`` names, on this builder's model."""
        served = adapter.name if adapter is not None else self._cfg.served_model_name
        if body.model != served or (adapter is not None and adapter.model != self._cfg.served_model_name):
            raise NotFound(f"the model {body.model!r} does not exist", code="model_not_found", param="model")
        jobs = await self._build_all(request_id, tenant, body)
        if adapter is None:
            return jobs
        return [replace(job, adapter=adapter.name, adapter_path=adapter.path) for job in jobs]

    async def _build_all(
        self, request_id: str, tenant: Tenant, body: CompletionRequest | ChatCompletionRequest
    ) -> list[Job]:
        samples = body.samples if isinstance(body, CompletionRequest) else body.n
        if samples > self._cfg.max_n:
            param = "n" if samples == body.n else "best_of"
            raise BadRequest(
                f"{param} is at most {self._cfg.max_n} on this server", code="invalid_n", param=param
            )
        if isinstance(body, ChatCompletionRequest):
            await check_tool_request(body)
            messages, tools = body.template_messages(), body.template_tools()
            chars = sum(len(m["content"]) for m in messages) + len(str(tools or ""))
            family = self.tool_family

            def chat(ms: list[dict]) -> list[int]:
                return self._encoder.chat(ms, tools, family)

            ids = await self._encode(chat, messages, chars, "messages")
            return [await self._job(request_id, tenant, body, ids)]
        prompts = body.prompts()
        jobs = []
        for i, prompt in enumerate(prompts):
            chars = len(prompt) if isinstance(prompt, str) else 0  # token ids: counted as they are
            param = "prompt" if len(prompts) == 1 else f"prompt.{i}"
            try:
                ids = await self._encode(self._encoder.completion, prompt, chars, param)
            except BadRequest as exc:  # name the batch's prompt that is wrong
                exc.param = param
                raise
            jobs.append(
                await self._job(request_id if len(prompts) == 1 else f"{request_id}-{i}", tenant, body, ids)
            )
        return jobs

    async def _job(
        self, request_id: str, tenant: Tenant, body: CompletionRequest | ChatCompletionRequest, ids: list[int]
    ) -> Job:
        """One prompt's job: its sampling, limits and context checked."""
        sampling = {**body.sampling_fields(), **self._checkpoint_defaults(body)}
        if isinstance(body, ChatCompletionRequest) and body.tool_mode == "forced":
            sampling["grammar"] = tool_grammar(body)  # the call, enforced as response_format's schemas
        await check_grammar(sampling["grammar"])  # a bad schema: a 400 that points into it
        if isinstance(body, ChatCompletionRequest):
            max_tokens = body.output_limit() or await self._chat_default_limit(len(ids), tenant)
            sampling["logprobs"] = body.logprob_count()
        else:
            max_tokens, prompt_logprobs = _completion_limits(body)
            sampling["n"] = body.samples
            # best_of ranks its samples by cumulative logprob: the chosen tokens' logprobs are needed
            # even when the answer shows none.
            ranked = body.samples > body.n
            sampling["logprobs"] = body.logprobs if body.logprobs is not None or not ranked else 0
            sampling["prompt_logprobs"] = prompt_logprobs
        if max_tokens is None:  # a completion's default (OpenAI's 16), within what the tenant may ask
            given = self._encoder.sampling_defaults.get("max_tokens", self._cfg.default_max_tokens)
            max_tokens = min(given, *_tenant_caps(tenant, len(ids)))
        await self._check_context(len(ids), max_tokens)
        self._check_token_ids(sampling)
        sampling["max_tokens"] = max_tokens
        try:
            SamplingParams(**sampling)  # validate here: a bad value is a 400 before any quota is taken
        except (ValueError, TypeError, OverflowError) as exc:
            raise BadRequest(str(exc)) from None
        coalesce = self._cfg.stream_interval_s if body.stream else NON_STREAM_COALESCE_S
        salt = body.cache_salt  # the scope's narrowing; the tenant part is the router's own
        return Job(
            request_id, tenant, tenant.sla_class, ids, sampling, coalesce, user=body.user, cache_salt=salt
        )

    def _checkpoint_defaults(self, body: CompletionRequest | ChatCompletionRequest) -> dict:
        """The checkpoint's recommended values for the sampling fields this request leaves out."""
        given = body.model_fields_set
        defaults = self._encoder.sampling_defaults
        return {k: v for k, v in defaults.items() if k != "max_tokens" and k not in given}

    async def _chat_default_limit(self, prompt_tokens: int, tenant: Tenant) -> int:
        """A chat request without max_tokens may answer to the end of the context, as OpenAI and vLLM
        allow; the checkpoint's max_new_tokens or `chat_default_max_tokens` cap it where set, and so
        do the tenant's own limits (its max_tokens_per_request, its context): the plainest call of
        an OpenAI client must not be refused for a number it never sent. The quota's reservation
        and the fair queue count the same figure."""
        room = max(await self._context() - prompt_tokens, 1)
        caps = [self._encoder.sampling_defaults.get("max_tokens"), self._cfg.chat_default_max_tokens]
        return min([room, *(int(c) for c in caps if c), *_tenant_caps(tenant, prompt_tokens)])

    def _check_token_ids(self, sampling: dict) -> None:
        """logit_bias keys must be token ids of this model's vocabulary."""
        vocab = self._encoder.vocab_size
        bound = f"0 to {vocab - 1}" if vocab else "non-negative"
        for key in sampling["logit_bias"]:
            if not key.lstrip("-").isdigit() or (vocab is not None and not 0 <= int(key) < vocab):
                raise BadRequest(
                    f"logit_bias: {key!r} is not a token id of this model ({bound})",
                    code="invalid_logit_bias",
                    param="logit_bias",
                )

    @property
    def encoder(self) -> PromptEncoder:
        return self._encoder

    async def _encode(self, encode: Callable, prompt, chars: int, param: str) -> list[int]:
        """Tokenize (and template) a prompt without holding the router's event loop: text that cannot
        fit the context is refused before any tokenizing (no token of this vocabulary holds more
        than `max_token_chars` characters), and long text is tokenized on a worker thread."""
        if chars and chars > await self._context() * self._encoder.max_token_chars:
            raise BadRequest(
                f"the prompt's {chars} characters cannot fit this model's context of "
                f"{self._max_model_len} tokens",
                code="context_length_exceeded",
                param=param,
            )
        if chars > INLINE_CHARS:
            return await asyncio.to_thread(encode, prompt)
        return encode(prompt)

    async def _context(self) -> int:
        if self._max_model_len is None:
            self._max_model_len = await self._fetch_len()
        return self._max_model_len

    async def _check_context(self, prompt_tokens: int, max_tokens: int) -> None:
        limit = await self._context()
        if prompt_tokens + max_tokens > limit:
            raise BadRequest(
                f"this model's maximum context length is {limit} tokens; the request asks for "
                f"{prompt_tokens + max_tokens} ({prompt_tokens} in the prompt, {max_tokens} to generate)",
                code="context_length_exceeded",
                param="prompt",
            )


def _tenant_caps(tenant: Tenant, prompt_tokens: int) -> tuple[int, int]:
    """The most one answer of ``tenant``'s may ask for: its max_tokens_per_request, and what its
    max_context_length leaves after the prompt (at least 1: a prompt over it is refused as such)."""
    q = tenant.quotas
    return q.max_tokens_per_request, max(1, q.max_context_length - prompt_tokens)


def _completion_limits(body: CompletionRequest) -> tuple[int | None, int | None]:
    """max_tokens and the prompt logprobs a completion asks for: echo with logprobs scores the prompt,
    and max_tokens 0 (scoring only) needs echo."""
    if body.max_tokens == 0 and not body.echo:
        raise BadRequest("max_tokens 0 needs echo (it scores the prompt only)", param="max_tokens")
    prompt_logprobs = None
    if body.echo and (body.logprobs is not None or body.max_tokens == 0):
        prompt_logprobs = body.logprobs or 0
    return body.max_tokens, prompt_logprobs
