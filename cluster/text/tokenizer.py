"""A checkpoint's tokenizer on the router, read with the `tokenizers` library alone.

transformers' tokenizer classes import torch, and a router that tokenizes never needs it (~400 MB
of resident memory per router). A child process exports the tokenizer transformers builds from the
checkpoint (`cluster/text/tokenizer_export.py`) once into the model cache; the router reads that
pipeline, the chat template and the special tokens' names from there. Encoding is then the
replica's by construction, and chat templates render in transformers' Jinja environment
(`cluster/text/chat_template.py`); tests/cluster/text/test_router_tokenizer.py compares both.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from cluster.text.chat_template import render_chat
from cluster.text.tokenizer_export import META_FILE
from replica.embedded_model import cache_root

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


@dataclass
class RouterTokenizer:
    core: Tokenizer
    chat_template: str | None = None
    special_tokens: dict[str, str] = field(default_factory=dict)
    clean_up_spaces: bool = False

    @classmethod
    def from_dir(cls, model_dir: Path) -> RouterTokenizer:
        exported = exported_dir(model_dir)
        meta = json.loads((exported / META_FILE).read_text(encoding="utf-8"))
        return cls(
            core=Tokenizer.from_file(str(exported / "tokenizer.json")),
            chat_template=meta["chat_template"],
            special_tokens=meta["special_tokens"],
            clean_up_spaces=meta["clean_up_spaces"],
        )

    def __len__(self) -> int:
        return self.core.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.core.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        text = self.core.decode(ids, skip_special_tokens=False)
        return _clean_up(text) if self.clean_up_spaces else text

    def id_to_token(self, token_id: int) -> str | None:
        return self.core.id_to_token(token_id)

    def render_chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        assert self.chat_template is not None
        return render_chat(self.chat_template, messages, self.special_tokens, **kwargs)


def exported_dir(model_dir: Path) -> Path:
    """The router's export of `model_dir`'s tokenizer, made once (keyed by the files' path and mtime)."""
    target = _cache_entry(model_dir)
    if (target / META_FILE).exists():
        return target
    staging = _staging(target)
    done = _run_export([(model_dir.resolve(), staging)])
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        raise FileNotFoundError(f"{model_dir.resolve()}: its tokenizer could not be loaded: {last}")
    _publish(staging, target)
    return target


def export_all(model_dirs: Iterable[Path]) -> None:
    """Export each directory's tokenizer not in the cache yet, all in one child process: a router
    serving several checkpoints pays transformers' import once, not once per checkpoint one after
    another (six new checkpoints: ~36 s of one router's start on the 2-core box, ~7 s in one child).
    Best effort: a directory it could not export is left to ``exported_dir``, which tries it alone
    and says why."""
    jobs = []
    for model_dir in dict.fromkeys(d.resolve() for d in model_dirs):
        if not (model_dir / "tokenizer.json").exists():
            continue  # exported_dir's error
        target = _cache_entry(model_dir)
        if not (target / META_FILE).exists():
            jobs.append((model_dir, target, _staging(target)))
    if not jobs:
        return
    _run_export([(model_dir, staging) for model_dir, _, staging in jobs])
    for _, target, staging in jobs:
        if (staging / META_FILE).exists():
            _publish(staging, target)
        else:
            shutil.rmtree(staging, ignore_errors=True)


def _cache_entry(model_dir: Path) -> Path:
    """Where the export of `model_dir`'s tokenizer is kept: keyed by the files' path and mtime."""
    model_dir = model_dir.resolve()
    if not (model_dir / "tokenizer.json").exists():
        raise FileNotFoundError(f"{model_dir} has no tokenizer.json (the router needs a fast tokenizer)")
    stamp = [str(model_dir)] + [
        f"{name}:{(model_dir / name).stat().st_mtime_ns}"
        for name in TOKENIZER_FILES
        if (model_dir / name).exists()
    ]
    key = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:20]
    return cache_root() / "router-tokenizers" / key


def _staging(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))


def _run_export(pairs: list[tuple[Path, Path]]) -> subprocess.CompletedProcess[str]:
    """`cluster/text/tokenizer_export.py` in a child process, for each (checkpoint, output) pair."""
    code = [sys.executable, "-m", "cluster.text.tokenizer_export", *(str(p) for pair in pairs for p in pair)]
    return subprocess.run(
        code, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    )


def _publish(staging: Path, target: Path) -> None:
    try:
        staging.rename(target)
    except OSError:  # another router exported it first
        shutil.rmtree(staging, ignore_errors=True)


def _clean_up(text: str) -> str:
    """transformers' `clean_up_tokenization`: no space before punctuation and English contractions."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):  # fmt: skip
        text = text.replace(before, after)
    return text
