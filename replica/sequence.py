"""One request's state inside the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from replica.sampling_params import SamplingParams

RANK = attrgetter("priority", "arrival")  # scheduling order: tier, then arrival


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Tokens, cache position and stop state of one request.

    `tokens` holds the prompt and every output token read back so far. `num_pending` counts tokens
    that a step has sampled on the device but the host has not read yet (0 or 1): in async mode the
    next step consumes such a token straight from the device through `pending_row`.

    A request with n > 1 is n sequences: sample 0 (the parent) computes the prompt; the others wait
    in its `forks` until the step that finishes the prompt, which draws every sample's first token
    from the prompt's last row and gives each fork the parent's prompt blocks (shared, counted).
    """

    request_id: str
    tokens: list[int]
    num_prompt: int
    params: SamplingParams
    seed: int  # 32-bit, drawn when the request has no seed of its own
    arrival: float
    max_len: int  # the model's context limit for this sequence
    # The request's SLA tier (0 first): the scheduler admits by (priority, arrival) and preempts the
    # lowest tier's latest arrival first (replica/scheduler.py).
    priority: int = 0
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0  # tokens whose keys and values are in the cache (or being written)
    num_pending: int = 0
    pending_row: int = -1  # row of the pending token in the in-flight step's samples
    block_table: list[int] = field(default_factory=list)
    block_array: np.ndarray | None = None  # while running: the scheduler's row mirroring block_table
    row: int = -1  # that row's index in the scheduler's block_rows
    finish_reason: str | None = None
    num_preemptions: int = 0
    sink: object | None = None  # set by the engine: its request's OpenRequest (replica/open_request.py)
    index: int = 0  # which of the request's n samples
    forks: list[Sequence] = field(default_factory=list)  # samples 1..n-1, until the prompt is done
    # Token ids banned until min_tokens are out (the model's EOS ids and the request's stop ids).
    min_tokens_ban: tuple[int, ...] = ()
    prompt_logprobs: list = field(default_factory=list)  # filled chunk by chunk when asked for
    # Prompt positions whose scoring is planned. Ahead of `prompt_logprobs` while a step is in
    # flight: the next chunk is planned before the last one's scores reach the host.
    prompt_scored: int = 0
    # Structured output: the grammar matcher (one per sample), advanced by each token the host reads
    # back; done once the grammar has ended (or refused a token: `grammar_error` says why).
    matcher: object | None = None
    grammar_done: bool = False
    grammar_error: str | None = None
    prompt_logprobs_sent: bool = False
    # Prefix caching (replica/prefix_cache.py): the chain's root (None: caching off), the keys of the
    # full blocks hashed so far, how many of the table's blocks are registered, and the prompt
    # tokens a lookup found in the cache at first admission (reported as cached tokens).
    cache_root: bytes | None = None
    block_keys: list[bytes] = field(default_factory=list)
    num_registered: int = 0
    num_cached_tokens: int = 0
    # Multi-LoRA: the request's adapter (a replica.lora_adapter.LoraAdapter; None: the base model)
    # and the device slot it holds while admitted (-1: none; replica/lora_slots.py).
    lora: object | None = None
    lora_slot: int = -1
    # temperature, top_k, top_p, min_p, seed and the three penalties as one row (exact in float64:
    # the seed has 32 bits); the input builder reads this one tuple per sequence.
    sampling_row: tuple[float, ...] = field(init=False)
    plain_greedy: bool = field(init=False)  # no penalties, bias, bans or logprobs: the fastest steps
    penalized: bool = field(init=False)
    # Tokens (prompt + output) past which nothing more may be scheduled: max_tokens or the context.
    token_limit: int = field(init=False)

    def __post_init__(self) -> None:
        p = self.params
        self.sampling_row = (
            0.0 if p.greedy else p.temperature, p.top_k, p.top_p, p.min_p, self.seed,
            p.repetition_penalty, p.frequency_penalty, p.presence_penalty,
            -1 if p.logprobs is None else p.logprobs,  # logprob_k: -1, no logprobs
        )  # fmt: skip
        self.plain_greedy = p.plain_greedy and p.prompt_logprobs is None
        self.penalized = p.penalized
        self.token_limit = min(self.num_prompt + p.max_tokens, self.max_len)

    @property
    def key(self) -> tuple[str, int]:
        """The sequence's identity: its request and sample index."""
        return (self.request_id, self.index)

    def bias_entries(self) -> tuple[list[int], list[float]]:
        """Token ids and additive biases for this sequence's next draw (logit_bias, then the min_tokens
        ban while the output is short)."""
        ids = [t for t, _ in self.params.logit_bias]
        values = [b for _, b in self.params.logit_bias]
        if self.num_output + self.num_pending - 1 < self.params.min_tokens:
            ids += self.min_tokens_ban
            values += [float("-inf")] * len(self.min_tokens_ban)
        return ids, values

    @property
    def adapter(self) -> str | None:
        """The name of the request's LoRA adapter (None: the base model)."""
        return self.lora.name if self.lora is not None else None

    @property
    def num_tokens(self) -> int:
        """Tokens the sequence will hold once its pending token lands."""
        return len(self.tokens) + self.num_pending

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def reached_length_limit(self) -> bool:
        """No further token may be scheduled: max_tokens or the context would be exceeded."""
        return len(self.tokens) + self.num_pending >= self.token_limit

    def uncomputed(self) -> int:
        return self.num_tokens - self.num_computed
