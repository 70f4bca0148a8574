"""Logprobs on their way from a step's host arrays to a request's outputs."""

from __future__ import annotations

from dataclasses import dataclass

from replica.outputs import TokenLogprob
from replica.sequence import Sequence
from replica.step_handle import StepResult


@dataclass
class StepLogprobs:
    """A step's logprob arrays as Python lists, converted once for all its rows: row by row, the
    numpy slices and their conversions took the host's post-processing from 1.3 to 3.3 ms a step
    with 256 rows asking the top 20 on the H200's host, at saturation where the host sets the pace."""

    logprob: list[float]
    top_ids: list[list[int]]
    top_values: list[list[float]]


def step_logprobs(result: StepResult) -> StepLogprobs | None:
    """None in steps where no row asked (the arrays were not copied back)."""
    if result.logprob is None:
        return None
    return StepLogprobs(result.logprob.tolist(), result.top_ids.tolist(), result.top_logprobs.tolist())


def token_logprob(lists: StepLogprobs | None, row: int, seq: Sequence, token: int) -> TokenLogprob | None:
    """The drawn token's logprob and the top ones the request asked for."""
    k = seq.params.logprobs
    if k is None or lists is None:
        return None
    top = tuple(zip(lists.top_ids[row][:k], lists.top_values[row][:k], strict=True))
    return TokenLogprob(token, lists.logprob[row], top)


def add_prompt_logprobs(scores) -> None:
    """Append a chunk's prompt logprobs to its sequence (positions past the prompt are dropped)."""
    seq = scores.chunk.seq
    k = seq.params.prompt_logprobs
    wanted = seq.num_prompt - 1 - len(seq.prompt_logprobs)
    count = min(scores.chunk.count, wanted)
    targets = seq.tokens[len(seq.prompt_logprobs) + 1 : len(seq.prompt_logprobs) + 1 + count]
    logprob = scores.logprob[:count].tolist()
    ids, values = scores.top_ids[:count, :k].tolist(), scores.top_logprobs[:count, :k].tolist()
    for i, token in enumerate(targets):
        seq.prompt_logprobs.append(
            TokenLogprob(token, logprob[i], tuple(zip(ids[i], values[i], strict=True)))
        )


def take_prompt_logprobs(seq: Sequence) -> list[TokenLogprob | None] | None:
    """The prompt's logprobs, once (with the sample's first delivery), None for the first token."""
    if seq.params.prompt_logprobs is None or seq.index != 0 or seq.prompt_logprobs_sent:
        return None
    seq.prompt_logprobs_sent = True
    return [None, *seq.prompt_logprobs]
