"""Per-request sampling parameters, validated at the engine's edge.

The order the engine applies them in (docs/engine.md, "Sampling"): the model's logits, then the
repetition, frequency and presence penalties, then logit_bias and the min_tokens ban, then
temperature, then the top-k, top-p and min-p filters (taken jointly on the tempered distribution),
then the draw. Logprobs describe the model's own distribution: log_softmax of its raw logits,
before any of those steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from replica.errors import InvalidRequestError
from replica.grammar_spec import GrammarSpec, grammar_spec

MAX_LOGPROBS = 20  # top logprobs per token (OpenAI's top_logprobs bound)
MAX_LOGIT_BIAS = 300  # entries per request
MAX_STOP_TOKEN_IDS = 16
BIAS_LIMIT = 100.0  # logit_bias values lie in [-100, 100], as OpenAI's


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and when it stops.

    temperature 0 means greedy. top_k 0, top_p 1.0 and min_p 0 switch those filters off. A request
    without a seed gets a random one, so its sampling is still reproducible from the engine's logs.
    n > 1 draws n answers from one prompt (they share its KV cache); sample i > 0 uses a seed
    derived from the request's seed and i. logprobs: None for none, k >= 0 for the chosen token's
    logprob and the k most likely tokens'. prompt_logprobs likewise for every prompt token but the
    first; with it, max_tokens may be 0 (score the prompt, generate nothing).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        # Lists and dicts are accepted for convenience and frozen into tuples.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple((_token_id(k), float(v)) for k, v in bias))
        object.__setattr__(self, "grammar", grammar_spec(self.grammar))
        self._validate()

    def _validate(self) -> None:
        prompt_only = self.prompt_logprobs is not None
        if not isinstance(self.max_tokens, int) or self.max_tokens < (0 if prompt_only else 1):
            raise InvalidRequestError(
                f"max_tokens must be positive (0 only with prompt logprobs), got {self.max_tokens!r}"
            )
        self._check_range("temperature", self.temperature, 0.0, 100.0)
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0 (0 disables it), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        self._check_range("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequestError(f"seed must be in [0, 2**63), got {self.seed!r}")
        if not isinstance(self.n, int) or self.n < 1:
            raise InvalidRequestError(f"n must be a positive integer, got {self.n!r}")
        self._check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        self._check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise InvalidRequestError(
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty!r}"
            )
        self._validate_bias()
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= max(self.max_tokens, 0):
            raise InvalidRequestError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS):
                raise InvalidRequestError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value!r}")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS or any(t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError(f"stop_token_ids takes at most {MAX_STOP_TOKEN_IDS} non-negative ids")
        if self.grammar is not None and self.min_tokens:
            # The grammar allows EOS only when the output is complete; a ban on it then leaves nothing.
            raise InvalidRequestError("min_tokens cannot be combined with a response format")

    def _validate_bias(self) -> None:
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(f"logit_bias takes at most {MAX_LOGIT_BIAS} entries")
        for token, value in self.logit_bias:
            if token < 0:
                raise InvalidRequestError(f"logit_bias: token id {token} is negative")
            if not -BIAS_LIMIT <= value <= BIAS_LIMIT:
                raise InvalidRequestError(f"logit_bias values must be in [-100, 100], got {value!r}")

    @staticmethod
    def _check_range(name: str, value: float, low: float, high: float) -> None:
        if not isinstance(value, int | float) or math.isnan(value) or not low <= value <= high:
            raise InvalidRequestError(f"{name} must be in [{low:g}, {high:g}], got {value!r}")

    @property
    def greedy(self) -> bool:
        """The pick is the argmax (top_k 1 is greedy too)."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Needs the sequence's token counts on the device."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def plain_greedy(self) -> bool:
        """Nothing but the argmax of the raw logits: the fastest step kind can serve it."""
        return (
            self.greedy
            and not self.penalized
            and not self.logit_bias
            and self.min_tokens == 0
            and self.logprobs is None
            and self.grammar is None
        )


def _token_id(key) -> int:
    """logit_bias keys arrive as ints or, from JSON, as strings of digits."""
    try:
        return int(key)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"logit_bias keys must be token ids, got {key!r}") from None
