"""Logprobs in OpenAI's two shapes, from the replica's [token id, logprob, [[id, logprob], ...]] lists.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}``.
Completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``; an
echoed prompt comes first, its first token with null logprobs (nothing precedes it).

The values are the model's own distribution (log_softmax of its raw logits, before penalties,
bias, temperature and filters), as vLLM reports by default. A value that is not a finite number
(-inf where a float underflowed; NaN from a broken model) is sent as -9999.0, as vLLM and OpenAI
do: JSON has no such numbers, and a stream must stay parseable by every client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TokenText = Callable[[int], str]
FLOOR = -9999.0  # the least logprob sent


def _finite(logprob: float) -> float:
    return logprob if logprob > FLOOR else FLOOR  # NaN compares False: the floor too


def chat_logprobs(entries: list[list], token_text: TokenText, top: int) -> dict[str, Any]:
    return {"content": [_chat_entry(e, token_text, top) for e in entries], "refusal": None}


def _chat_entry(entry: list, token_text: TokenText, top: int) -> dict[str, Any]:
    token_id, logprob, tops = entry
    text = token_text(token_id)
    return {
        "token": text,
        "logprob": _finite(logprob),
        "bytes": list(text.encode("utf-8")),
        "top_logprobs": [
            {"token": (t := token_text(i)), "logprob": _finite(v), "bytes": list(t.encode("utf-8"))}
            for i, v in tops[:top]
        ],
    }


class CompletionLogprobs:
    """One choice's completion-style logprobs, built as its tokens arrive (text offsets run on)."""

    def __init__(self, token_text: TokenText, top: int, offset: int = 0) -> None:
        self._text = token_text
        self._top = top
        self.offset = offset

    def block(self, entries: list[list | None], tokens: list[int]) -> dict[str, Any]:
        """The logprobs of `tokens` (None entries: an echoed prompt's first token)."""
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, entry in zip(tokens, entries, strict=True):
            text = self._text(token_id)
            out["tokens"].append(text)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(_finite(entry[1]))
            out["top_logprobs"].append({self._text(i): _finite(v) for i, v in entry[2][: self._top]})
        return out


def merge_completion_logprobs(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not parts:
        return None
    return {key: [v for part in parts for v in part[key]] for key in parts[0]}
