"""Turning OpenAI prompts into token ids on the router, with the replica's tokenizer files.

The router tokenizes (rather than the replica) so admission knows the prompt's size before the
request takes a quota slot or a place in the queue. It loads only the tokenizer, never weights.
Text is encoded without special tokens, exactly as ``replica.Engine`` does, so results match.
"""

from __future__ import annotations

from functools import cached_property

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cluster.errors import BadRequest
from cluster.word_tokenizer import word_tokenizer
from replica.model_loader import cache_root, model_dir_for
from replica.presets import REAL_WEIGHTS


def load_tokenizer(
    model: str, random_weights: bool, synthetic: bool = False
) -> PreTrainedTokenizerBase | None:
    """The model's tokenizer, or None for random-weight presets without one (token ids only).

    ``synthetic``: the generated word tokenizer the replicas attach too (``cluster.word_tokenizer``).
    """
    if synthetic:
        vocab = _vocab_from_config(model)
        if vocab is None:
            raise ValueError(f"synthetic_tokenizer needs a preset (its vocabulary size), not {model!r}")
        return word_tokenizer(vocab)
    if random_weights:
        cached = cache_root() / model
        if model in REAL_WEIGHTS and (cached / "tokenizer.json").exists():
            return AutoTokenizer.from_pretrained(cached)
        return None
    return AutoTokenizer.from_pretrained(model_dir_for(model))


class PromptEncoder:
    """Encodes completion prompts and chat messages; checks ids against the vocabulary."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None, vocab_size: int | None) -> None:
        self._tok = tokenizer
        self._vocab = vocab_size
        self._token_text: dict[int, str] = {}

    @property
    def vocab_size(self) -> int | None:
        return self._vocab

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one token can stand for (its byte-level or piece string is at least as
        long as the text it decodes to), so text longer than context x this cannot fit."""
        if self._tok is None:
            return 1 << 30  # token ids only: nothing to bound by
        tokens = self._tok.convert_ids_to_tokens(list(range(len(self._tok))))
        return max(len(t) for t in tokens if t is not None)

    def token_text(self, token_id: int) -> str:
        """One token as text (logprobs name tokens so); "token_id:N" without a tokenizer."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self._tok.decode([token_id]) if self._tok is not None else f"token_id:{token_id}"
            if len(self._token_text) < 200_000:
                self._token_text[token_id] = text
        return text

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids) if self._tok is not None else ""

    @classmethod
    def for_model(cls, model: str, random_weights: bool, synthetic: bool = False) -> PromptEncoder:
        tok = load_tokenizer(model, random_weights, synthetic)
        vocab = len(tok) if tok is not None else _vocab_from_config(model)
        return cls(tok, vocab)

    def completion(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self._tok is None:
                raise BadRequest("this model has no tokenizer: send token ids", param="prompt")
            ids = self._tok.encode(prompt, add_special_tokens=False)
        else:
            ids = list(prompt)
        return self._checked(ids, "prompt")

    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        if self._tok is None or not getattr(self._tok, "chat_template", None):
            raise BadRequest("this model has no chat template", param="messages")
        text = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self._checked(self._tok.encode(text, add_special_tokens=False), "messages")

    def _checked(self, ids: list[int], param: str) -> list[int]:
        if not ids:
            raise BadRequest("the prompt is empty", param=param)
        if self._vocab is not None:
            bad = [t for t in ids if not 0 <= t < self._vocab]
            if bad:
                raise BadRequest(f"token ids out of range [0, {self._vocab}): {bad[:5]}", param=param)
        return ids


def _vocab_from_config(model: str) -> int | None:
    from replica.presets import SHAPES

    shape = SHAPES.get(model)
    # Without a tokenizer or preset the replica's engine still checks the ids against its vocabulary.
    return None if shape is None else shape.to_config_dict().get("vocab_size")
