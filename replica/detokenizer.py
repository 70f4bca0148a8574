"""Incremental detokenization with stop strings, per sequence.

Text is decoded over a sliding window of ids so each step costs O(window), not O(output). While
stop strings are set, the last len(longest stop) - 1 characters are held back, so a client never
sees the beginning of a stop string that is cut off a step later.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

_CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output so the first word's spacing is right


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: list[int],
        stop: tuple[str, ...],
        include_stop: bool,
    ) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = stop
        self.include_stop = include_stop
        self.hold_back = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # all output text decoded so far (cut at a stop string once one is found)
        self.emitted = 0  # characters of `text` already handed to the caller
        self.stopped = False

    def add(self, token_id: int, check_stops: bool = True) -> None:
        """Append one token; sets `stopped` when a stop string appears (looked for only while
        `check_stops`: a request's min_tokens come out whatever they hold)."""
        self.ids.append(token_id)
        delta = self._decode_delta()
        if not delta:
            return
        search_from = max(0, len(self.text) - self.hold_back)
        self.text += delta
        if not check_stops:
            return
        for stop in self.stop:
            at = self.text.find(stop, search_from)
            if at >= 0:
                self.text = self.text[: at + len(stop) if self.include_stop else at]
                self.stopped = True
                return

    def take(self, final: bool) -> str:
        """Text not yet handed out; on the final call everything left, otherwise minus the hold-back."""
        end = (
            len(self.text) if (final or self.stopped) else max(self.emitted, len(self.text) - self.hold_back)
        )
        out = self.text[self.emitted : end]
        self.emitted = end
        return out

    def _decode_delta(self) -> str:
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""  # an incomplete UTF-8 sequence: wait for the next token
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]
