"""Turning OpenAI prompts into token ids on the router, with the replica's tokenizer files.

The router tokenizes (rather than the replica) so admission knows the prompt's size before the
request takes a quota slot or a place in the queue. It loads only the tokenizer, never weights,
and never torch (`cluster/text/tokenizer.py`). Completions are encoded as the checkpoint's
tokenizer encodes text (with its BOS where it adds one); chat prompts come from the checkpoint's
template, which writes its own special tokens, so they are encoded without adding any.
"""

from __future__ import annotations

import subprocess
import sys
from functools import cached_property
from pathlib import Path
from typing import Any

from cluster.errors import BadRequest
from cluster.text.chat_template import TemplateRefused
from cluster.text.tokenizer import RouterTokenizer
from cluster.text.tool_parsers import Family
from cluster.text.tool_prompt import parser_family, template_inputs
from cluster.text.word_tokenizer import word_router_tokenizer
from replica.embedded_model import cache_root
from replica.errors import UnknownModelError
from replica.generation_defaults import read_generation_defaults
from replica.presets import REAL_WEIGHTS, SHAPES


def load_tokenizer(model: str, random_weights: bool, synthetic: bool = False) -> RouterTokenizer | None:
    """The model's tokenizer, or None for random-weight presets without one (token ids only).

    ``synthetic``: the generated word tokenizer the replicas attach too (``cluster.text.word_tokenizer``).
    """
    if synthetic:
        vocab = _vocab_from_config(model)
        if vocab is None:
            raise ValueError(f"synthetic_tokenizer needs a preset (its vocabulary size), not {model!r}")
        return word_router_tokenizer(vocab)
    source = tokenizer_source(model, random_weights)
    return RouterTokenizer.from_dir(source) if source is not None else None


def tokenizer_source(model: str, random_weights: bool, synthetic: bool = False) -> Path | None:
    """The directory ``load_tokenizer`` reads the model's tokenizer from; None where it reads none
    (the synthetic word tokenizer, random weights without a converted tokenizer)."""
    if synthetic:
        return None
    if random_weights:
        cached = cache_root() / model
        return cached if model in REAL_WEIGHTS and (cached / "tokenizer.json").exists() else None
    return tokenizer_dir(model)


def tokenizer_dir(model: str) -> Path:
    """The checkpoint directory of `model`: a path, or a preset's converted cache. A preset not yet
    converted is converted by a child process, so the router never loads torch to do it."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    cached = cache_root() / model
    if model in REAL_WEIGHTS and not (cached / "tokenizer.json").exists():
        code = f"from replica.model_loader import model_dir_for; model_dir_for({model!r})"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode != 0:
            raise UnknownModelError(done.stderr.strip().splitlines()[-1] if done.stderr else model)
    if model in REAL_WEIGHTS:
        return cached
    known = ", ".join(sorted(SHAPES))
    raise UnknownModelError(f"unknown model {model!r}: not a directory, and not one of the presets ({known})")


class PromptEncoder:
    """Encodes completion prompts and chat messages; checks ids against the vocabulary."""

    def __init__(
        self,
        tokenizer: RouterTokenizer | None,
        vocab_size: int | None,
        sampling_defaults: dict[str, float | int] | None = None,
    ) -> None:
        self._tok = tokenizer
        self._vocab = vocab_size
        self._token_text: dict[int, str] = {}
        # The checkpoint's recommended sampling values (generation_config.json), for fields a
        # request leaves out, as vLLM applies them; empty for presets.
        self.sampling_defaults = dict(sampling_defaults or {})

    @property
    def vocab_size(self) -> int | None:
        return self._vocab

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one token can stand for (its byte-level or piece string is at least as
        long as the text it decodes to), so text longer than context x this cannot fit."""
        if self._tok is None:
            return 1 << 30  # token ids only: nothing to bound by
        tokens = (self._tok.id_to_token(i) for i in range(len(self._tok)))
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
        defaults = {}
        if not (random_weights or synthetic):
            defaults = read_generation_defaults(tokenizer_dir(model)).sampling_overrides()
        return cls(tok, vocab, defaults)

    def completion(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self._tok is None:
                raise BadRequest("this model has no tokenizer: send token ids", param="prompt")
            ids = self._tok.encode(prompt, add_special_tokens=True)
        else:
            ids = list(prompt)
        return self._checked(ids, "prompt")

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        family: Family = "hermes",
    ) -> list[int]:
        """The chat prompt's ids; ``tools`` go through the template, or its fallback (tool_prompt.py)."""
        if self._tok is None or not self._tok.chat_template:
            raise BadRequest("this model has no chat template: use /v1/completions", param="messages")
        try:
            messages, extra = template_inputs(self._tok.chat_template, messages, tools, family)
            text = self._tok.render_chat(messages, add_generation_prompt=True, **extra)
        except TemplateRefused as exc:
            refused = f"the model's chat template refused these messages: {exc}"
            raise BadRequest(refused, param="messages") from exc
        return self._checked(self._tok.encode(text, add_special_tokens=False), "messages")

    def tool_family(self, configured: str) -> Family:
        """The parser family of this model's tool calls: the configured one, else its template's."""
        return parser_family(self._tok.chat_template if self._tok is not None else None, configured)

    def _checked(self, ids: list[int], param: str) -> list[int]:
        if not ids:
            raise BadRequest("the prompt is empty", param=param)
        if self._vocab is not None:
            bad = [t for t in ids if not 0 <= t < self._vocab]
            if bad:
                raise BadRequest(f"token ids out of range [0, {self._vocab}): {bad[:5]}", param=param)
        return ids


def _vocab_from_config(model: str) -> int | None:
    shape = SHAPES.get(model)
    # Without a tokenizer or preset the replica's engine still checks the ids against its vocabulary.
    return None if shape is None else shape.to_config_dict().get("vocab_size")
