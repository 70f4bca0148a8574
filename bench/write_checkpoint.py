"""Write a random-weight checkpoint directory of a preset shape, as a downloaded one would look.

    python -m bench.write_checkpoint --shape llama-3.1-8b --out /tmp/llama8b [--dtype bfloat16]
        [--arch llama|qwen2|qwen3|mistral] [--shard-size 5GB] [--layers N] [--head-dim N]

The GPU machine reaches no hub; this gives it a directory to serve and benchmark through the real
loader (config.json from transformers, sharded safetensors with model.safetensors.index.json,
generation_config.json, tokenizer with chat template). The weights come from our own module's
`init_random` on the device (an 8B model is built and filled in about a second on a GPU) and are
written under Hugging Face's names by `replica.weights.hf_state_dict`, each shard copied to the host
and written on a thread of its own so copies and disk writes overlap. The tokenizer is SmolLM2's
from the converted cache (ids past its 49,152 decode to nothing), or a generated word-level one.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from replica.checkpoint import INDEX_NAME
from replica.embedded_model import cache_root
from replica.model_loader import build_model
from replica.presets import SHAPES, ModelShape
from replica.weights import hf_state_dict, init_random

ARCHS = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}
MISTRAL_WINDOW = 4096  # Mistral-7B-v0.1's
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """'5GB' -> 5e9 bytes (decimal units, as transformers' max_shard_size)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def hf_config(
    shape: ModelShape, arch: str, layers: int | None = None, head_dim: int | None = None,
    sliding_window: int | None = None,
):  # fmt: skip
    """transformers' config of `arch` with the preset's sizes (Llama 3 rope scaling for llama only)."""
    values = shape.to_config_dict()
    for key in ("model_type", "architectures", "rope_scaling", "rope_theta", "head_dim"):
        values.pop(key)
    if arch != "llama":
        values["rope_parameters"] = {"rope_type": "default", "rope_theta": shape.rope_theta}
    values["num_hidden_layers"] = layers or shape.num_hidden_layers
    values["head_dim"] = head_dim or shape.hidden_size // shape.num_attention_heads
    if arch == "mistral":
        values["sliding_window"] = sliding_window or None
    cls = ARCHS[arch]
    return cls(**values, architectures=[cls.__name__.replace("Config", "ForCausalLM")])


def write_checkpoint(
    shape: str, out: Path, dtype: torch.dtype = torch.bfloat16, arch: str = "llama", shard_size: str = "5GB",
    layers: int | None = None, head_dim: int | None = None, sliding_window: int | None = MISTRAL_WINDOW,
    seed: int = 0, device: str | None = None,
) -> Path:  # fmt: skip
    """Build, fill and save; returns `out`."""
    config = hf_config(SHAPES[shape], arch, layers, head_dim, sliding_window)
    config.dtype = dtype
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = build_model(config, target, dtype)
    init_random(model, seed)
    out.mkdir(parents=True, exist_ok=True)
    _save_tensors(hf_state_dict(model), out, parse_size(shard_size))
    config.save_pretrained(out)
    ends = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}
    GenerationConfig(**ends).save_pretrained(out)
    checkpoint_tokenizer(config.vocab_size).save_pretrained(out)
    return out


def _shards(state: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in order, a new shard whenever the next would pass `limit` bytes (as transformers)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def _save_tensors(state: dict[str, torch.Tensor], out: Path, limit: int) -> None:
    shards = _shards(state, limit)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )

    def write(shard: dict[str, torch.Tensor], name: str) -> None:
        host = {k: v.detach().to("cpu").contiguous() for k, v in shard.items()}
        save_file(host, str(out / name), metadata={"format": "pt"})

    with ThreadPoolExecutor(max_workers=min(3, len(shards))) as pool:
        list(pool.map(write, shards, names))
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in state.values())
        weight_map = {k: name for shard, name in zip(shards, names, strict=True) for k in shard}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_NAME).write_text(json.dumps(index, indent=2))


def checkpoint_tokenizer(vocab_size: int):
    """SmolLM2's tokenizer from the converted cache, else a word-level one over the whole vocab."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cached = cache_root() / "smollm2-135m"
    if (cached / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(cached)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(prefix="\x00", cleanup=True)  # joins words with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} \n{% endfor %}"
        "{% if add_generation_prompt %}assistant :{% endif %}"
    )
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--arch", default="llama", choices=sorted(ARCHS))
    parser.add_argument("--shard-size", default="5GB")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's")
    parser.add_argument("--head-dim", type=int, default=None, help="e.g. 128 for a Qwen3-like head")
    parser.add_argument("--sliding-window", type=int, default=MISTRAL_WINDOW, help="mistral; 0: none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="default: cuda when available")
    args = parser.parse_args()
    start = time.perf_counter()
    out = write_checkpoint(
        args.shape, args.out, getattr(torch, args.dtype), args.arch, args.shard_size, args.layers,
        args.head_dim, args.sliding_window, args.seed, args.device,
    )  # fmt: skip
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    print(json.dumps({"out": str(out), "bytes": size, "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    main()
