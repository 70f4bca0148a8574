"""Bad adapters and bad adapter requests get clear errors, and the replica keeps serving."""

from __future__ import annotations

import json

import pytest

from replica import Engine, EngineConfig, SamplingParams
from replica.errors import AdapterError, InvalidRequestError, UnknownAdapterError
from tests.replica.checkpoints import random_hf_model, save_checkpoint, tiny_config
from tests.replica.lora_checkpoints import write_adapter

VOCAB = 49152
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, smollm2_dir):
    root = tmp_path_factory.mktemp("lora-errors")
    kind = tiny_config("llama-tied", VOCAB)
    model = random_hf_model(kind, seed=7)
    return model, save_checkpoint(model, kind, root / "model", smollm2_dir), root


@pytest.fixture(scope="module")
async def engine(setup):
    _, model_dir, _ = setup
    eng = Engine(
        EngineConfig(model=str(model_dir), device="cpu", mode="async", lora_slots=2, max_lora_rank=8)
    )
    await eng.start()
    yield eng
    await eng.stop()


async def _tokens(engine, adapter=None) -> list[int]:
    return [t async for out in engine.generate([5, 6, 7, 8], GREEDY, adapter=adapter) for t in out.token_ids]


def test_errors_are_invalid_requests():
    assert issubclass(AdapterError, InvalidRequestError) and issubclass(
        UnknownAdapterError, InvalidRequestError
    )


async def test_bad_adapters_are_refused_and_the_engine_keeps_serving(engine, setup):
    model, _, root = setup
    good = write_adapter(model, root / "good", rank=8)
    engine.add_adapter("good", str(good))
    cases = {
        "rank above max_lora_rank": (write_adapter(model, root / "r16", rank=16), "max_lora_rank 8"),
        "no directory": (root / "missing", "not a directory"),
        "DoRA": (write_adapter(model, root / "dora", use_dora=True), "use_dora"),
        "modules saved whole": (
            write_adapter(model, root / "mts", modules_to_save=["lm_head"]),
            "modules_to_save",
        ),
        "embedding target": (write_adapter(model, root / "emb", targets=["embed_tokens"]), "not supported"),
    }
    other = tiny_config("llama-tied", VOCAB, hidden=32, heads=2, kv_heads=1)
    cases["another base model"] = (write_adapter(random_hf_model(other), root / "other"), "do not fit")
    truncated = write_adapter(model, root / "trunc")
    data = (truncated / "adapter_model.safetensors").read_bytes()
    (truncated / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    cases["truncated file"] = (truncated, "unreadable")
    biased = write_adapter(model, root / "bias")
    config = json.loads((biased / "adapter_config.json").read_text())
    (biased / "adapter_config.json").write_text(json.dumps(config | {"bias": "all"}))
    cases["bias"] = (biased, "bias 'all'")
    for what, (path, message) in cases.items():
        with pytest.raises(AdapterError, match=message):
            engine.add_adapter(what, str(path))
    with pytest.raises(AdapterError, match="registered already"):
        engine.add_adapter("good", str(good))
    assert engine.adapters() == ["good"]
    with pytest.raises(UnknownAdapterError):
        await _tokens(engine, "nope")
    assert len(await _tokens(engine, "good")) == 4 and len(await _tokens(engine)) == 4
    engine.remove_adapter("good")
    with pytest.raises(UnknownAdapterError):
        await _tokens(engine, "good")
    with pytest.raises(UnknownAdapterError):
        engine.remove_adapter("good")
    assert engine.adapters() == [] and engine.resident_adapters() == []
    assert len(await _tokens(engine)) == 4


async def test_lora_off(setup):
    model, model_dir, root = setup
    engine = Engine(EngineConfig(model=str(model_dir), device="cpu"))
    await engine.start()
    try:
        with pytest.raises(AdapterError, match="LoRA is off"):
            engine.add_adapter("x", str(write_adapter(model, root / "off")))
        with pytest.raises(UnknownAdapterError):
            await _tokens(engine, "x")
        assert engine.adapters() == [] and engine.resident_adapters() == []
        assert engine.core.runner.lora is None and engine.core.runner.buffers[0].np["lora_slot"].size == 0
    finally:
        await engine.stop()


def test_config_refuses_bad_lora_settings():
    with pytest.raises(AdapterError, match="max_lora_rank"):
        EngineConfig(lora_slots=1, max_lora_rank=65)
    with pytest.raises(AdapterError, match="LoRA is off"):
        EngineConfig(lora_adapters=(("a", "/x"),))
    with pytest.raises(AdapterError, match="distinct"):
        EngineConfig(lora_slots=1, lora_adapters=(("a", "/x"), ("a", "/y")))


async def test_a_bad_configured_adapter_stops_the_start(setup):
    _, model_dir, root = setup
    engine = Engine(
        EngineConfig(
            model=str(model_dir), device="cpu", lora_slots=1, lora_adapters=(("a", str(root / "none")),)
        )
    )
    with pytest.raises(AdapterError, match="not a directory"):
        await engine.start()
