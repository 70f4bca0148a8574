"""The FP8 settings reach the engine per model: the chart's values and schema, the cluster's
EngineSettings, EngineConfig (cluster/model_settings.py, cluster/app.py, helm/fairlane)."""

from __future__ import annotations

import helm_python
import pytest

from cluster.app import engine_kwargs
from cluster.config import AppConfig
from replica import EngineConfig
from tests.helm.chart import render

MODELS = [
    {"name": "small", "engine": {"model": "smollm2-135m"}},
    {"name": "big-fp8", "engine": {"model": "llama-3.2-1b", "quantization": "fp8", "kv_cache_dtype": "auto"}},
]


def test_quantization_is_set_per_model_through_the_chart() -> None:
    values = {"app": {"models": MODELS, "autoscaling": None}, "gpuWorkers": {"maxReplicas": 8}}
    config = AppConfig.model_validate(render(values).app_args)
    small, big = config.served_models
    assert engine_kwargs(small.engine)["quantization"] is None
    kwargs = engine_kwargs(big.engine)
    assert (kwargs["quantization"], kwargs["kv_cache_dtype"]) == ("fp8", "auto")
    engine = EngineConfig(**kwargs)  # the replica builds its engine config from exactly these
    assert (engine.quantization, engine.kv_cache_dtype) == ("fp8", "auto")


@pytest.mark.parametrize(
    ("engine", "where"),
    [
        ({"quantization": "int4"}, "/app/engine/quantization"),
        ({"kv_cache_dtype": "fp16"}, "/app/engine/kv_cache_dtype"),
    ],
)
def test_the_chart_refuses_unknown_values(engine: dict, where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as info:
        render({"app": {"engine": engine}})
    assert where in str(info.value)


def test_the_settings_refuse_unknown_values() -> None:
    with pytest.raises(ValueError, match="quantization"):
        AppConfig.model_validate({"engine": {"quantization": "int8"}})
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        AppConfig.model_validate({"engine": {"kv_cache_dtype": "int8"}})
