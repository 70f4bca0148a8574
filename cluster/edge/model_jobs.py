"""Each served model's ``JobBuilder``: that model's tokenizer and context limit, one builder per model.

A builder builds jobs for one model; the ingress routes a request to its model's pool first (the
404 for a model the tenant may not use comes from there), then to that model's builder.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from ray.serve.handle import DeploymentHandle

from cluster.config import AppConfig
from cluster.edge.job_builder import JobBuilder
from cluster.text.prompts import PromptEncoder, tokenizer_source
from cluster.text.tokenizer import export_all


def job_builders(cfg: AppConfig, replicas: Mapping[str, DeploymentHandle]) -> dict[str, JobBuilder]:
    """Served name -> its builder. Models on one checkpoint share one loaded tokenizer; the
    checkpoints' tokenizers not exported yet are exported first, in one child process."""
    keys = [
        (m.engine.model, m.engine.random_weights, m.engine.synthetic_tokenizer) for m in cfg.served_models
    ]
    export_all(source for key in keys if (source := tokenizer_source(*key)) is not None)
    encoders: dict[tuple[str, bool, bool], PromptEncoder] = {}
    builders = {}
    for m in cfg.served_models:
        e = m.engine
        key = (e.model, e.random_weights, e.synthetic_tokenizer)
        if key not in encoders:
            encoders[key] = PromptEncoder.for_model(*key)
        # The builder's config names its own model as the served one (the check it makes).
        view = cfg.model_copy(update={"served_model_name": m.name})
        builders[m.name] = JobBuilder(view, encoders[key], context_of(replicas[m.name]), m.tool_call_parser)
    return builders


def context_of(handle: DeploymentHandle) -> Callable[[], Awaitable[int]]:
    """Asks one of the model's replicas for its context limit (the builder caches the answer)."""

    async def max_model_len() -> int:
        info = await handle.info.remote()
        return int(info["max_model_len"])

    return max_model_len
