"""The router's torch-free tokenizer gives the ids and text transformers gives, for the same files."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing
from transformers import AutoTokenizer

from cluster.errors import BadRequest
from cluster.text.prompts import PromptEncoder, tokenizer_dir
from cluster.text.tokenizer import RouterTokenizer, export_all, exported_dir

TEXTS = [
    "Hello there",
    "  leading spaces, trailing  ",
    "Ünïcödé — emoji 🎉 and 中文",
    "code:\n\tdef f(x):\n\t\treturn x ** 2\n",
    "<|im_start|>special tokens written as text<|im_end|>",
    "It isn't what you'd think ; it 's fine .",
]
CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, in 中文."},
    ],
]
# A Llama-3-style template: BOS written by the template, loop controls, raise_exception, tojson.
LLAMA3_STYLE = (
    "{{ bos_token }}{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}"
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{% if loop.index > 8 %}{% break %}{% endif %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def smollm_dir() -> Path:
    return tokenizer_dir("smollm2-135m")


def both(model_dir: Path) -> tuple[RouterTokenizer, object]:
    return RouterTokenizer.from_dir(model_dir), AutoTokenizer.from_pretrained(model_dir)


def test_ids_text_and_templates_match_transformers(smollm_dir: Path):
    ours, theirs = both(smollm_dir)
    assert len(ours) == len(theirs)
    for text in TEXTS:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == theirs.encode(text, add_special_tokens=special), text
            assert ours.decode(ids) == theirs.decode(ids), text
    for messages in CONVERSATIONS:
        for generation in (True, False):
            expected = theirs.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)
            assert ours.render_chat(messages, add_generation_prompt=generation) == expected
    for i in (0, 1, 2, 100, 5000, len(ours) - 1):
        assert ours.id_to_token(i) == theirs.convert_ids_to_tokens(i)


def copy_with_config(src: Path, dst: Path, **config) -> Path:
    dst.mkdir()
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    base = json.loads((src / "tokenizer_config.json").read_text())
    base.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps({**base, **config}))
    return dst


def test_bos_where_the_tokenizer_adds_it_and_a_llama3_style_template(smollm_dir: Path, tmp_path: Path):
    """A tokenizer whose post-processor adds BOS (as Llama 3's does) gets it on completions; the
    template's own BOS is not added twice; tools render as transformers' tojson renders them."""
    model_dir = copy_with_config(
        smollm_dir, tmp_path / "llama-like", bos_token="<|im_start|>", chat_template=LLAMA3_STYLE
    )
    core = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    core.post_processor = TemplateProcessing(
        single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|> $B", special_tokens=[("<|im_start|>", 1)]
    )
    core.save(str(model_dir / "tokenizer.json"))
    ours, theirs = both(model_dir)
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=True)
        assert ids == theirs.encode(text, add_special_tokens=True), text
        assert ids[0] == ours.core.token_to_id("<|im_start|>")
    tools = [{"type": "function", "function": {"name": "f", "description": "ü"}}]
    for messages in CONVERSATIONS:
        kwargs = {"tools": tools, "add_generation_prompt": True}
        expected = theirs.apply_chat_template(messages, tokenize=False, **kwargs)
        assert ours.render_chat(messages, **kwargs) == expected
    encoder = PromptEncoder(ours, len(ours))
    chat_ids = encoder.chat(CONVERSATIONS[0])
    assert chat_ids.count(ours.core.token_to_id("<|im_start|>")) == 1  # the template's BOS, once
    assert encoder.completion("Hello")[0] == ours.core.token_to_id("<|im_start|>")


def test_template_refusals_and_missing_templates_are_400s(smollm_dir: Path, tmp_path: Path):
    encoder = PromptEncoder(RouterTokenizer.from_dir(copy_with_config(
        smollm_dir, tmp_path / "strict", chat_template=LLAMA3_STYLE
    )), None)  # fmt: skip
    with pytest.raises(BadRequest, match="unknown role tool"):
        encoder.chat([{"role": "tool", "content": "x"}])
    bare = PromptEncoder(RouterTokenizer.from_dir(copy_with_config(smollm_dir, tmp_path / "bare")), None)
    with pytest.raises(BadRequest, match="no chat template"):
        bare.chat(CONVERSATIONS[0])
    assert bare.completion("Hello")  # completions need no template


def test_a_template_in_its_own_file_wins(smollm_dir: Path, tmp_path: Path):
    model_dir = copy_with_config(smollm_dir, tmp_path / "jinja-file", chat_template="{{ 'from config' }}")
    (model_dir / "chat_template.jinja").write_text("{{ 'from file' }}")
    assert RouterTokenizer.from_dir(model_dir).render_chat([]) == "from file"


def test_a_routers_new_checkpoints_export_in_one_child(smollm_dir: Path, tmp_path: Path, monkeypatch):
    """export_all: every directory not in the cache yet in one child process (one transformers import),
    the same export exported_dir makes; a directory that cannot be exported leaves the others done
    and gets its own error from exported_dir."""
    dirs = [
        copy_with_config(smollm_dir, tmp_path / name, chat_template=f"{{{{ '{name}' }}}}") for name in "ab"
    ]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("not json")
    children = []
    real_run = subprocess.run

    def counted(code, **kwargs):
        children.append(code)
        return real_run(code, **kwargs)

    monkeypatch.setattr(subprocess, "run", counted)
    export_all([*dirs, broken, dirs[0]])
    assert len(children) == 1
    for name, model_dir in zip("ab", dirs, strict=True):
        assert RouterTokenizer.from_dir(model_dir).render_chat([]) == name
    assert len(children) == 1  # read from the cache, no child of its own
    reference = copy_with_config(smollm_dir, tmp_path / "alone", chat_template="{{ 'a' }}")
    assert sorted(p.name for p in exported_dir(dirs[0]).iterdir()) == sorted(
        p.name for p in exported_dir(reference).iterdir()
    )
    assert exported_dir(dirs[0]).joinpath("tokenizer.json").read_bytes() == (
        exported_dir(reference).joinpath("tokenizer.json").read_bytes()
    )
    with pytest.raises(FileNotFoundError, match="broken: its tokenizer could not be loaded"):
        exported_dir(broken)
    export_all(dirs)
    assert len(children) == 3  # the reference's and broken's own; then nothing new to export
