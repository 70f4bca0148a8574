"""Read a Hugging Face safetensors checkpoint: one file, or shards listed in an index.

Every failure names the file it concerns (`CheckpointError`), and what can be checked before any
weight is read is checked first: a missing shard fails the load in milliseconds, not after minutes
of reading the others.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from replica.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint, every one present."""
    index = model_dir / INDEX_NAME
    if index.exists():
        files = sorted(set(_weight_map(index).values()))
    else:
        files = [p.name for p in sorted(model_dir.glob("*.safetensors"))]
    if not files:
        raise CheckpointError(f"{model_dir}: no *.safetensors files (and no {INDEX_NAME})")
    missing = [name for name in files if not (model_dir / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{index}: lists {len(missing)} shard file(s) that are not in {model_dir}: {', '.join(missing)}"
        )
    return [model_dir / name for name in files]


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index}: not a safetensors index with a weight_map ({exc!r})") from exc
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: its weight_map is empty")
    return weight_map


def checkpoint_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor, Path]]:
    """(name, tensor, file) for every tensor of the checkpoint, one file at a time."""
    for path in checkpoint_files(model_dir):
        yield from _file_tensors(path)


def _file_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor, Path]]:
    # safetensors raises its own error types (a Rust SafetensorError, OSError, ...) for a truncated
    # header or data that does not match it; callers get one type naming the file.
    try:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield key, f.get_tensor(key), path
    except Exception as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc
