"""A generated word-level tokenizer for random-weight presets (``engine.synthetic_tokenizer``).

Random-weight presets ship no tokenizer (only SmolLM2's can be reused, from its converted cache),
so a cluster serving one takes token ids only: no chat, no text out, and a load generator sees no
content chunks (no ITL, no token timeline, no fairness service). This tokenizer is built in memory
from the vocabulary size alone, the same on the router and on every replica, with no file and no
download. One word or punctuation mark is one token, so a prompt of N words is about N tokens
(the load generator's convention); words it does not know encode as ``<unk>``. Every id decodes
to a word (``w<id>``), so a random model's output streams as text. The text means nothing: a
benchmark of a random-weight model needs the lengths, not the words.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from cluster.text.tokenizer import RouterTokenizer

# Ids 0-2 match the presets' config (bos 1, eos 2), so an engine's stop ids keep their meaning.
SPECIALS = ("<unk>", "<s>", "</s>")
PUNCTUATION = tuple(".,;:!?'\"()[]{}-+*/=<>#%&@$_|~`^\\")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} \n{% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
# The chat template's words and the load generator's filler words (loadtest/prompts.py); the rest
# of an English prompt is <unk>, which changes its length by nothing.
COMMON_WORDS = (
    "user", "assistant", "system", "the", "a", "of", "to", "and", "in", "is", "it", "what", "how",
    "time", "people", "way", "day", "man", "thing", "world", "life", "hand", "part", "place", "case",
    "week", "work", "point", "home", "water", "room", "fact", "book", "word",
)  # fmt: skip


def vocabulary(vocab_size: int) -> dict[str, int]:
    """Specials, punctuation, common words, then ``w<id>`` up to ``vocab_size`` entries."""
    words = list(dict.fromkeys((*SPECIALS, *PUNCTUATION, *COMMON_WORDS)))
    if vocab_size < len(words) + 1:
        raise ValueError(f"vocab_size {vocab_size} is too small for the word tokenizer ({len(words) + 1})")
    vocab = {w: i for i, w in enumerate(words)}
    for i in range(len(words), vocab_size):
        vocab[f"w{i}"] = i
    return vocab


@cache
def word_core(vocab_size: int) -> Tokenizer:
    """The tokenizers-library pipeline for ``vocab_size`` ids (cached: built once per process)."""
    core = Tokenizer(models.WordLevel(vocabulary(vocab_size), unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    # WordPiece's decoder with no continuation prefix joins tokens with spaces (the WordLevel default
    # does too, but says so nowhere; this makes it explicit) and tidies spaces before punctuation.
    core.decoder = decoders.WordPiece(prefix="\x00", cleanup=True)
    return core


def word_router_tokenizer(vocab_size: int) -> RouterTokenizer:
    """The router's view: no transformers, so no torch in the router process."""
    specials = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    return RouterTokenizer(core=word_core(vocab_size), chat_template=CHAT_TEMPLATE, special_tokens=specials)


@cache
def word_tokenizer(vocab_size: int) -> Any:
    """The replica's view, a transformers ``PreTrainedTokenizerFast`` over the same pipeline."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=word_core(vocab_size),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=1 << 20,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def attach_to_engine(engine: Any, tokenizer: Any) -> None:
    """Give a started ``replica.Engine`` this tokenizer (it then detokenizes and takes text).

    ``replica.EngineConfig`` has no tokenizer field, and the engine reads ``loaded.tokenizer`` for
    each new request, so setting it after ``start`` is enough; a field there would be cleaner.
    """
    if engine.loaded is None:
        raise RuntimeError("start the engine before attaching a tokenizer")
    engine.loaded.tokenizer = tokenizer
