"""Every architecture served from its checkpoint directory through the OpenAI API: one app with a
tiny checkpoint of each kind as its own model (named by nothing but its directory), the chat
template applied by the router, and the greedy answer equal to transformers' float32 generate on
the same templated prompt."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from ray import serve
from transformers import AutoTokenizer

from cluster.text.prompts import tokenizer_dir
from tests.cluster.helpers import ALICE, admin_state, start_app, wait_until
from tests.replica.checkpoints import KINDS, hf_from_dir, hf_greedy_many, random_hf_model, save_checkpoint
from tests.replica.checkpoints import tiny_config as kind_of

APP = "fl-checkpoints"
MAX_TOKENS = 10
QUESTIONS = [
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is two plus two?"}],
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A directory per kind, written by save_pretrained with the embedded default's tokenizer (and
    its chat template), as a downloaded checkpoint would be."""
    tok_dir = tokenizer_dir("smollm2-135m")
    vocab = len(AutoTokenizer.from_pretrained(tok_dir))
    root = tmp_path_factory.mktemp("served-checkpoints")
    out = {}
    for seed, name in enumerate(KINDS):
        kind = kind_of(name, vocab)
        out[name] = save_checkpoint(random_hf_model(kind, seed), kind, root / name, tok_dir)
    return out


@pytest.fixture(scope="module")
def app_url(ray_serve: int, checkpoints: dict[str, Path], tenancy_file: Path) -> Iterator[str]:
    config = {
        "engine": {"device": "cpu", "kv_cache_tokens": 1024, "max_num_seqs": 4},
        # No names: each entry is served under its checkpoint directory's name.
        "models": [{"engine": {"model": str(path)}} for path in checkpoints.values()],
        "replica_num_cpus": 0.5,
        "tenancy_config": str(tenancy_file),
        "queue_timeout_s": 600.0,
    }
    start_app(APP, "/ckpt", config)
    yield f"http://127.0.0.1:{ray_serve}/ckpt"
    serve.delete(APP)


def reference(model_dir: Path, messages: list[dict]) -> str:
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tok.encode(text, add_special_tokens=False)
    eos = sorted({tok.eos_token_id, hf_from_dir(model_dir).config.eos_token_id})
    ids = hf_greedy_many(hf_from_dir(model_dir), [prompt], [MAX_TOKENS], eos)[0]
    return tok.decode([t for t in ids if t not in eos])


@pytest.mark.slow
def test_every_architecture_answers_chat_as_transformers(app_url: str, checkpoints: dict[str, Path]) -> None:
    client = openai.OpenAI(base_url=f"{app_url}/v1", api_key=ALICE, max_retries=0, timeout=300)
    assert sorted(m.id for m in client.models.list().data) == sorted(checkpoints)

    def ask(job: tuple[str, int]) -> str:
        name, q = job
        chat = client.chat.completions.create(
            model=name, messages=QUESTIONS[q], max_tokens=MAX_TOKENS, temperature=0
        )
        return chat.choices[0].message.content

    jobs = [(name, q) for name in checkpoints for q in range(len(QUESTIONS))]
    with ThreadPoolExecutor(len(jobs)) as pool:  # every model at once, two questions each
        answers = dict(zip(jobs, pool.map(ask, jobs), strict=True))
    for (name, q), answer in answers.items():
        assert answer and answer == reference(checkpoints[name], QUESTIONS[q]), (name, q, answer)


def test_each_model_s_room_follows_its_engine_s_slots(app_url: str, checkpoints: dict[str, Path]) -> None:
    """No replica_room set: each model's room per replica is its engine's slots, as its replicas
    report them, and the router shows the sizes the engines run with."""

    def reported() -> bool:
        models = admin_state(app_url)["models"]
        return all(models[name]["engine_slots"] == 4 for name in checkpoints)

    assert wait_until(reported, timeout_s=60)
    for name in checkpoints:
        state = admin_state(app_url)["models"][name]
        assert state["room_per_replica"] == 4 and state["room_source"] == "engine slots"
        assert state["engine"]["device"] == "cpu" and state["engine"]["kv_tokens"] == 1024
        assert "max_num_seqs" not in state["engine"]["chosen"]
