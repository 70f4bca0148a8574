"""A request's way into the engine: its prompt checked against the model, its sizes against this
replica, and its sequences (one per sample) made with their seeds and detokenizers.

Pure functions of what they are given (the engine passes its model's vocabulary, its sizes, its
tokenizer), run on the caller's event loop before the engine's thread sees the request.
"""

from __future__ import annotations

import random
import time

from replica.block_manager import BlockManager
from replica.detokenizer import IncrementalDetokenizer
from replica.errors import InvalidRequestError, PromptTooLongError
from replica.sampler import mix_seed
from replica.sampling_params import SamplingParams
from replica.sequence import Sequence


def prompt_ids(prompt, tokenizer, vocab: int) -> list[int]:
    """Token ids of a text (BOS where the tokenizer adds one) or of ids, each within the vocabulary."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise InvalidRequestError("this model has no tokenizer: send token ids")
        ids = tokenizer.encode(prompt, add_special_tokens=True)
    else:
        ids = [int(t) for t in prompt]
    if not ids:
        raise InvalidRequestError("the prompt is empty")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(f"token ids out of range [0, {vocab}): {bad[:5]}")
    return ids


def check_fits(prompt_len: int, max_tokens: int, max_model_len: int, blocks: BlockManager) -> None:
    """The request fits the model's context and this replica's KV cache."""
    total = prompt_len + max_tokens
    if total > max_model_len:
        raise PromptTooLongError(
            f"this model's maximum context length is {max_model_len} tokens; the request asks for "
            f"{total} ({prompt_len} in the prompt, {max_tokens} to generate)"
        )
    if -(-total // blocks.block_size) > blocks.num_usable:
        raise PromptTooLongError(
            f"the request needs {total} tokens of KV cache; this replica holds "
            f"{blocks.num_usable * blocks.block_size}"
        )


def check_params(params: SamplingParams, vocab: int, max_num_seqs: int, tokenizer) -> None:
    """What only the loaded model and this engine's sizes can tell."""
    bad = [t for t, _ in params.logit_bias if t >= vocab]
    if bad:
        raise InvalidRequestError(f"logit_bias: token ids out of range [0, {vocab}): {bad[:5]}")
    if params.n > max_num_seqs:
        raise InvalidRequestError(f"n is at most {max_num_seqs} on this replica")
    if params.stop and tokenizer is None:
        raise InvalidRequestError("stop strings need a tokenizer; this model has none")


def make_sequences(
    ids: list[int],
    params: SamplingParams,
    request_id: str,
    *,
    eos_ids: set[int],
    max_model_len: int,
    cache_root: bytes | None,
    priority: int,
    tokenizer,
    lora=None,
) -> tuple[list[Sequence], list[IncrementalDetokenizer | None]]:
    """The request's sequences, one per sample (the first holds the others as forks), and their
    detokenizers (None without a tokenizer). `lora`: the request's LoRA adapter (None: the base)."""
    seed = params.seed if params.seed is not None else random.getrandbits(32)
    ban = (() if params.ignore_eos else tuple(sorted(eos_ids))) + params.stop_token_ids
    arrival = time.monotonic()
    seqs = [
        Sequence(
            request_id=request_id,
            tokens=list(ids),
            num_prompt=len(ids),
            params=params,
            seed=fold32(mix_seed(seed, index)),
            arrival=arrival,
            max_len=max_model_len,
            index=index,
            min_tokens_ban=ban if params.min_tokens else (),
            cache_root=cache_root,
            priority=priority,
            lora=lora,  # every sample (forks too) runs with the request's adapter
        )
        for index in range(params.n)
    ]
    seqs[0].forks = seqs[1:]
    detoks = [
        IncrementalDetokenizer(tokenizer, ids, params.stop, params.include_stop_str_in_output)
        if tokenizer is not None
        else None
        for _ in seqs
    ]
    return seqs, detoks


def fold32(seed: int) -> int:
    """A 64-bit seed folded into the 32 bits the sampler's hash takes."""
    return (seed ^ (seed >> 32)) & 0xFFFFFFFF
