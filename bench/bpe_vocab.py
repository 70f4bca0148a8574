"""A byte-level BPE tokenizer of Llama 3's size (128,256 ids), trained here, for grammar benchmarks.

The GPU machine and CI reach no model hub, and no Llama 3 tokenizer ships in a package, yet the
cost of a grammar's token mask grows with the vocabulary and depends on what its tokens look like
(how many hold a quote, a brace, a digit run, leading spaces). So we train one: the `tokenizers`
library's byte-level BPE (GPT-2's byte alphabet and pre-tokenizer, as Llama 3's is byte-level)
on the Python standard library's source and text files, which every machine with Python has.
Code, prose and English identifiers make merges much like a real model's: whole words with a
leading space, runs of spaces, punctuation pairs such as `":` and `},`. The result is cached
under ``~/.cache/fairlane/bench`` (about a minute to train on two cores).

    python -m bench.bpe_vocab --vocab 128256   # trains (or finds) it and prints its path
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

END_OF_TEXT = "<|end_of_text|>"
# Ids 1 and 2 are the random-weight presets' BOS and EOS (replica/presets.py), so an engine's end ids
# keep their meaning when this tokenizer is attached to one.
SPECIALS = ("<|pad|>", "<|begin_of_text|>", END_OF_TEXT)
CORPUS_SUFFIXES = (".py", ".txt", ".rst", ".html")
MAX_CORPUS_BYTES = 64 << 20  # enough for 128k merges; more only slows training


def cache_path(vocab_size: int) -> Path:
    return Path.home() / ".cache" / "fairlane" / "bench" / f"bpe-{vocab_size}.json"


def corpus_files() -> list[Path]:
    """The standard library's text files, in a fixed order (the same tokenizer on one Python)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*") if p.suffix in CORPUS_SUFFIXES and p.is_file())
    picked, total = [], 0
    for path in files:
        if "site-packages" in path.parts:
            continue
        total += path.stat().st_size
        picked.append(path)
        if total > MAX_CORPUS_BYTES:
            break
    return picked


def _lines(files: list[Path]) -> Iterator[str]:
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


def train(vocab_size: int) -> Tokenizer:
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = corpus_files()
    core.train_from_iterator(_lines(files), trainer=trainer, length=len(files))
    return core


def bpe_tokenizer(vocab_size: int = 128_256) -> Tokenizer:
    """The trained tokenizer (from the cache when it is there). It may hold fewer ids than asked when
    the corpus runs out of pairs; callers pad the model's vocabulary past it."""
    path = cache_path(vocab_size)
    if path.exists():
        return Tokenizer.from_file(str(path))
    core = train(vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    core.save(str(tmp))
    tmp.replace(path)
    return core


def hf_tokenizer(vocab_size: int = 128_256):
    """The same as a transformers fast tokenizer (what an engine's `loaded.tokenizer` is)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=bpe_tokenizer(vocab_size),
        pad_token=SPECIALS[0],
        bos_token=SPECIALS[1],
        eos_token=END_OF_TEXT,
        model_max_length=1 << 20,
    )


def attach(engine) -> None:
    """Give a started random-weight engine this tokenizer at its vocabulary size: it then detokenizes
    and serves response formats (whose grammars need every id's bytes). Ids the corpus could not
    fill (past the trained vocabulary) decode to nothing and no grammar allows them."""
    engine.loaded.tokenizer = hf_tokenizer(engine.loaded.config.vocab_size)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=128_256)
    args = parser.parse_args()
    t0 = time.perf_counter()
    core = bpe_tokenizer(args.vocab)
    print(f"{cache_path(args.vocab)}: {core.get_vocab_size()} ids ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
