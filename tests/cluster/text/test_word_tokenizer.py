"""The generated tokenizer of ``engine.synthetic_tokenizer``: lengths, decoding, chat, sharing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cluster.text.prompts import PromptEncoder
from cluster.text.word_tokenizer import SPECIALS, attach_to_engine, word_tokenizer

VOCAB = 49152  # the SmolLM2 preset's


def test_one_word_is_one_token_and_unknown_words_are_unk() -> None:
    tok = word_tokenizer(VOCAB)
    ids = tok.encode("the time of Zanzibar, people.", add_special_tokens=False)
    assert len(ids) == 7  # five words, a comma, a full stop
    assert ids[3] == tok.unk_token_id == 0
    assert len(tok) == VOCAB


def test_every_id_decodes_to_text_and_the_specials_keep_the_preset_ids() -> None:
    tok = word_tokenizer(VOCAB)
    assert tok.decode([VOCAB - 1, 40_000], skip_special_tokens=True) == f"w{VOCAB - 1} w40000"
    assert [tok.convert_tokens_to_ids(s) for s in SPECIALS] == [0, 1, 2]
    assert tok.eos_token_id == 2


def test_router_and_replica_share_one_tokenizer_with_a_chat_template() -> None:
    encoder = PromptEncoder.for_model("smollm2-135m", random_weights=True, synthetic=True)
    ids = encoder.chat([{"role": "user", "content": "the world"}])
    assert ids == word_tokenizer(VOCAB).encode("user : the world \nassistant :", add_special_tokens=False)
    engine = SimpleNamespace(loaded=SimpleNamespace(tokenizer=None))
    attach_to_engine(engine, word_tokenizer(VOCAB))
    assert engine.loaded.tokenizer is word_tokenizer(VOCAB)


def test_a_model_that_is_no_preset_is_refused() -> None:
    with pytest.raises(ValueError, match="preset"):
        PromptEncoder.for_model("/no/such/model", random_weights=True, synthetic=True)
    with pytest.raises(RuntimeError, match="start the engine"):
        attach_to_engine(SimpleNamespace(loaded=None), word_tokenizer(VOCAB))
