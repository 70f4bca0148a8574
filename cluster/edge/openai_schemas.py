"""OpenAI request and response bodies. Requests forbid unknown fields, so nothing is silently ignored.

Sampling fields are OpenAI's (temperature, top_p, n, seed, stop, presence_penalty,
frequency_penalty, logit_bias, logprobs) and vLLM's extras (top_k, min_p, repetition_penalty,
min_tokens, stop_token_ids, ignore_eos); `replica.SamplingParams` documents what each does.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cluster.edge.response_format import ResponseFormat, grammar_fields

MAX_STOP = 4
MAX_STOP_CHARS = 256  # a stop string is matched against the decoded tail at every step: keep it short


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = Field(default=False, description="Send a final chunk with token usage.")


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
    response_format: ResponseFormat | None = Field(
        default=None, description="text, json_object, or json_schema (the answer matches the schema)."
    )

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
            "grammar": grammar_fields(self.response_format),  # checks the schema: 400 points into it
        }


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(description="Text or token ids.")
    max_tokens: int | None = Field(default=None, ge=0, description="0 only with echo (score the prompt).")
    echo: bool = Field(default=False, description="Prepend the prompt (and its logprobs) to the choice.")
    logprobs: int | None = Field(default=None, ge=0, le=20, description="Top logprobs per token (0-20).")

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise ValueError("prompt: only one prompt per request is supported (batch of 1)")
            return p[0]
        return p


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = Field(default=False, description="Return the chosen tokens' logprobs.")
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description="With logprobs: the top 0-20.")

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        return self

    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, str]]:
        # The chat template knows system/user/assistant; "developer" is OpenAI's newer name for system.
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in self.messages
        ]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    ).model_dump()
