"""Logprobs on their way from a step's host arrays to a request's outputs."""

from __future__ import annotations

from replica.outputs import TokenLogprob
from replica.sequence import Sequence
from replica.step_handle import StepResult


def token_logprob(result: StepResult, row: int, seq: Sequence) -> TokenLogprob | None:
    """The drawn token's logprob and the top ones the request asked for (logprob steps only)."""
    k = seq.params.logprobs
    if k is None or result.logprob is None:
        return None
    ids, values = result.top_ids[row, :k].tolist(), result.top_logprobs[row, :k].tolist()
    token = int(result.tokens[row])
    return TokenLogprob(token, float(result.logprob[row]), tuple(zip(ids, values, strict=True)))


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
