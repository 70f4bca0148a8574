"""Engine fixtures: one loaded tokenizer and Hugging Face reference model per test session."""

from __future__ import annotations

import pytest
import torch

from replica.model_loader import model_dir_for
from tests.replica.corpus import QUESTIONS, long_text


@pytest.fixture(scope="session")
def smollm2_dir():
    return model_dir_for("smollm2-135m")


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def hf_model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def mixed_prompts(tokenizer) -> list[list[int]]:
    """16 prompts from 8 to 600 tokens: chat questions and slices of a long text."""
    base = tokenizer.encode(long_text(), add_special_tokens=False)
    lengths = [8, 600, 23, 150, 61, 420, 12, 300, 97, 35, 512, 17, 230, 44, 128, 75]
    prompts = []
    for i, n in enumerate(lengths):
        if i % 4 == 0:
            chat = tokenizer.apply_chat_template(
                [{"role": "user", "content": QUESTIONS[i // 4]}], add_generation_prompt=True, tokenize=False
            )
            ids = tokenizer.encode(chat, add_special_tokens=False)
        else:
            start = (i * 37) % (len(base) - n)
            ids = base[start : start + n]
        prompts.append(ids)
    return prompts


def hf_greedy(hf_model, prompt: list[int], max_tokens: int, eos_id: int) -> list[int]:
    """transformers' own greedy generate: the reference our engine must equal token for token."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=eos_id,
            pad_token_id=eos_id,
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
async def engine():
    """One running SmolLM2 engine (async mode) shared by a test module."""
    from replica import Engine, EngineConfig

    eng = Engine(EngineConfig(model="smollm2-135m", device="cpu", mode="async", max_num_batched_tokens=256))
    await eng.start()
    yield eng
    await eng.stop()


async def collect(engine, prompt, params, request_id=None):
    """All outputs of one request: (token ids, text, final output)."""
    tokens, text, last = [], "", None
    async for out in engine.generate(prompt, params, request_id=request_id):
        tokens.extend(out.token_ids)
        text += out.text
        last = out
    return tokens, text, last


async def wait_until(predicate, timeout: float = 5.0) -> None:
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.01)
