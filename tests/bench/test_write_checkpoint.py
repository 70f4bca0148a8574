"""bench/write_checkpoint.py writes a directory that transformers and our loader read alike."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.hf_reference import hf_model_like
from bench.write_checkpoint import parse_size, write_checkpoint
from replica.model_loader import load_model


def test_sizes_parse_in_decimal_units():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("500MB") == 5 * 10**8 and parse_size("1GiB") == 2**30
    with pytest.raises(ValueError, match="not a size"):
        parse_size("5 parsecs")


@pytest.mark.parametrize(
    ("arch", "head_dim"), [("llama", None), ("qwen2", None), ("qwen3", 128), ("mistral", None)]
)
def test_each_architecture_round_trips(tmp_path, arch, head_dim):
    out = write_checkpoint(
        "smollm2-135m", tmp_path / arch, torch.bfloat16, arch, "30MB", layers=2, head_dim=head_dim,
        sliding_window=2048, device="cpu",
    )  # fmt: skip
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2  # 71 MB of bf16 in 30 MB shards
    assert {"generation_config.json", "tokenizer_config.json", "config.json"} <= {
        p.name for p in out.iterdir()
    }
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    loaded = load_model(str(out), torch.device("cpu"), torch.float32, random_weights=False)
    assert type(hf).__name__ == loaded.architecture == hf.config.architectures[0]
    ours = hf_model_like(loaded).state_dict()
    theirs = hf.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
    assert loaded.max_model_len == (2048 if arch == "mistral" else 8192)
    assert loaded.model.head_dim == (head_dim or 64) and loaded.tokenizer.chat_template
