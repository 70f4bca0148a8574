"""What the engine hands back to callers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    arrival: float  # host monotonic clock (time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    num_preemptions: int = 0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token's logprob under the model, and the most likely tokens at its position (best first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RequestOutput:
    """One delivery for one of a request's samples: the tokens (and text) new since the previous one.

    A request with n samples delivers each sample's outputs under its `index`; each sample ends with
    its own finish reason, and the request ends when all have.
    """

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None  # None until the end, then "stop" | "length" | "abort"
    num_prompt_tokens: int
    num_output_tokens: int  # this sample's output tokens so far
    metrics: RequestMetrics | None = None  # set on the sample's final delivery
    index: int = 0
    logprobs: list[TokenLogprob] | None = None  # one per token in token_ids, when asked for
    prompt_logprobs: list[TokenLogprob | None] | None = None  # once, with the first delivery; [0] is None
    num_cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineStats:
    running: int = 0
    waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    num_preemptions: int = 0
    steps: int = 0
    requests_finished: int = 0
    output_tokens_per_s: float = 0.0
    mode: str = "async"
    # Prefix caching, since start: prompt tokens admitted and those found in the cache (once per
    # request), registered blocks now, and registered blocks evicted to make room.
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    kv_blocks_cached: int = 0
    kv_evictions: int = 0
    extra: dict = field(default_factory=dict)
