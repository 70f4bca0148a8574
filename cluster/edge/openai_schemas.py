"""OpenAI request and response bodies. Requests forbid unknown fields, so nothing is silently ignored.

Sampling fields are OpenAI's (temperature, top_p, n, seed, stop, presence_penalty,
frequency_penalty, logit_bias, logprobs) and vLLM's extras (top_k, min_p, repetition_penalty,
min_tokens, stop_token_ids, ignore_eos); `replica.SamplingParams` documents what each does.
Every other field of OpenAI's requests has its treatment in `openai_fields.py`: the chat request's
informational and refused fields are in `request_extras.py`, its messages in `chat_messages.py`, its
tool fields in `tool_schemas.py`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from cluster.edge.chat_messages import ChatMessage
from cluster.edge.openai_fields import COMPLETIONS, STREAM_OPTIONS, refusal
from cluster.edge.request_extras import ChatInforms, ChatRefuses
from cluster.edge.response_format import ResponseFormat, grammar_fields
from cluster.edge.tool_schemas import ChatTools, with_call_names

MAX_PROMPTS = 32  # prompts in one completions request: each is its own request to admit and queue
MAX_STOP = 4
MAX_STOP_CHARS = 256  # a stop string is matched against the decoded tail at every step: keep it short


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = Field(default=False, description="Send a final chunk with token usage.")
    continuous_usage_stats: bool = Field(
        default=False, description=STREAM_OPTIONS["continuous_usage_stats"].note
    )
    include_obfuscation: bool | None = Field(
        default=None, description=STREAM_OPTIONS["include_obfuscation"].note
    )


class _Sampling(_Strict):
    model: str = Field(description="Model name; must be the served model.")
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    n: int = Field(default=1, ge=1, description="Choices to sample from the prompt (the server caps it).")
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        default=None, description="Token id (as a string) -> bias added to its logit, at most 300 entries."
    )
    top_k: int | None = Field(
        default=None, ge=-1, description="vLLM: the k most likely tokens only (-1, 0: off)."
    )
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0, le=10)] = 1.0
    min_tokens: int = Field(
        default=0, ge=0, description="vLLM: no EOS, stop id or stop string before this many."
    )
    stop_token_ids: list[int] | None = Field(default=None, max_length=16)
    ignore_eos: bool = Field(default=False, description="vLLM: keep generating past EOS (benchmarks).")
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    cache_salt: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="vLLM: only requests of the same tenant (or cache group) with the same salt share "
        "cached prompt blocks.",
    )
    response_format: ResponseFormat | None = Field(
        default=None, description="text, json_object, or json_schema (the answer matches the schema)."
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_left_out(cls, data: Any) -> Any:
        """OpenAI's types allow null for most fields, meaning the default: the same as leaving the
        field out (so the checkpoint's defaults still apply). Unknown fields stay, to be refused."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}
        return data

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and (len(v) > MAX_STOP or any(not s for s in v)):
            raise ValueError(f"stop takes at most {MAX_STOP} non-empty strings")
        if any(len(s) > MAX_STOP_CHARS for s in ([v] if isinstance(v, str) else v or [])):
            raise ValueError(f"stop strings are at most {MAX_STOP_CHARS} characters")
        return v

    def stop_tuple(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk: vLLM's ``continuous_usage_stats``, which needs ``include_usage`` too."""
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def sampling_fields(self) -> dict:
        """The fields `replica.SamplingParams` takes, from this body (max_tokens and logprobs apart)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": max(self.top_k or 0, 0),
            "min_p": self.min_p,
            "seed": self.seed,
            "n": self.n,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "logit_bias": dict(self.logit_bias or {}),
            "min_tokens": self.min_tokens,
            "stop_token_ids": tuple(self.stop_token_ids or ()),
            "ignore_eos": self.ignore_eos,
            "stop": self.stop_tuple(),
            "grammar": grammar_fields(self.response_format),  # checked off the loop: job_builder
        }


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: a prompt, as text or token ids, or a batch of prompts."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description=COMPLETIONS["prompt"].note, min_length=1
    )
    max_tokens: int | None = Field(default=None, ge=0, description="0 only with echo (score the prompt).")
    echo: bool | None = Field(
        default=False, description="Prepend the prompt (and its logprobs) to the choice."
    )
    logprobs: int | None = Field(default=None, ge=0, le=20, description="Top logprobs per token (0-20).")
    best_of: int | None = Field(default=None, ge=1, description=COMPLETIONS["best_of"].note)
    suffix: str | None = Field(default=None, description=COMPLETIONS["suffix"].note)

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_shape(cls, v: Any) -> Any:
        """One of OpenAI's four shapes, said plainly (a union's error would name each branch)."""
        if isinstance(v, list) and v:
            kinds = {type(p) for p in v}
            if len(kinds) > 1 or kinds - {str, int, list}:
                raise PydanticCustomError(
                    "invalid_prompt",
                    "a string, a list of token ids, a list of strings or a list of token-id lists",
                )
        return v

    @field_validator("prompt")
    @classmethod
    def _batch_size(cls, v: str | list) -> str | list:
        if isinstance(v, list) and v and isinstance(v[0], str | list) and len(v) > MAX_PROMPTS:
            raise ValueError(f"a batch takes at most {MAX_PROMPTS} prompts")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:  # "" inserts nothing: the same as no suffix
            raise refusal("suffix", COMPLETIONS)
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if v is not None and v < n:
            raise ValueError(f"best_of ({v}) must be at least n ({n})")
        if v is not None and v > n and info.data.get("stream"):
            raise ValueError("best_of above n cannot be streamed (the best choices are known at the end)")
        return v

    @property
    def samples(self) -> int:
        """Choices generated per prompt: best_of, or n."""
        return self.best_of or self.n

    def prompts(self) -> list[str | list[int]]:
        """The batch: one prompt (text or token ids) per entry."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            return list(p)  # type: ignore[arg-type]
        return [p]  # type: ignore[list-item]


class ChatCompletionRequest(_Sampling, ChatInforms, ChatRefuses, ChatTools):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = Field(default=False, description="Return the chosen tokens' logprobs.")
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description="With logprobs: the top 0-20.")

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs set to true")
        return v

    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        return with_call_names([m.template_dict() for m in self.messages])


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    ).model_dump()
