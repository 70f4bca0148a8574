"""Several models from the chart: app.models reaches AppConfig, the GPU check counts every model, and
the tenants' model lists and per-model limits reach the merged tenancy file."""

from __future__ import annotations

import helm_python
import pytest
import yaml

from cluster.config import AppConfig
from tenancy.loader import parse_tenancy_config
from tests.helm.chart import Rendered, chart_defaults, ci_values, render


def test_models_reach_the_app_config(all_options: Rendered) -> None:
    config = AppConfig.model_validate(all_options.app_args)
    first, second = config.served_models
    assert [first.name, second.name] == ["llama-3.1-8b", "llama-3.2-1b-random"]
    assert config.deployments == {
        "llama-3.1-8b": "Replica",
        "llama-3.2-1b-random": "Replica-llama-3.2-1b-random",
    }
    # The first takes app.engine whole and gives its own autoscaling; the second replaces two engine
    # fields and scales to a fixed count.
    assert first.engine == config.engine and first.autoscaling is not None
    assert (first.autoscaling.max_replicas, first.autoscaling.initial_replicas) == (6, 3)
    assert first.replica_room == 12 and first.replica_num_cpus == 2.0
    assert second.engine == config.engine.model_copy(update={"model": "llama-3.2-1b", "max_model_len": 4096})
    assert (second.autoscaling, second.num_replicas, second.replica_room) == (None, 2, 16)
    # served_model_name names the one-model form: the chart leaves it out with a list.
    assert "served_model_name" not in all_options.app_args
    assert config.served_model_name == "llama-3.1-8b"


def test_the_default_chart_serves_one_model(default: Rendered) -> None:
    config = AppConfig.model_validate(default.app_args)
    assert default.app_args["models"] == [] and [m.name for m in config.served_models] == ["smollm2-135m"]
    assert config.deployments == {"smollm2-135m": "Replica"}


def test_every_model_needs_its_gpus() -> None:
    # Two models inheriting app.autoscaling (at most 4 replicas of one GPU each) against 4 GPUs.
    with pytest.raises(
        helm_python.HelmError, match=r"need 8 GPUs but gpuWorkers\.maxReplicas x gpusPerPod gives 4"
    ):
        render({"app": {"models": [{"name": "a"}, {"name": "b"}]}})
    two = [{"name": "a", "autoscaling": {"max_replicas": 2}}, {"name": "b", "num_replicas": 2}]
    fits = render({"app": {"models": two}})
    assert [m["name"] for m in fits.app_args["models"]] == ["a", "b"]
    cpu_only = {"name": "b", "replica_num_gpus": 0.0, "engine": {"device": "cpu"}}
    assert render({"app": {"models": [{"name": "a"}, cpu_only]}}).app_args["models"][1] == cpu_only


def test_an_entry_without_a_name_serves_its_model_s_own_name() -> None:
    rendered = render({"app": {"models": [{"engine": {"model": "/models/Qwen2.5-7B-Instruct"}}]}})
    assert "name" not in rendered.app_args["models"][0]
    assert [m.name for m in AppConfig.model_validate(rendered.app_args).served_models] == [
        "Qwen2.5-7B-Instruct"
    ]


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"name": "a", "num_replicas": 1}, {"name": "a", "num_replicas": 1}], "duplicate model name a"),
        ([{"name": "a", "autoscaling": {"min_replicas": 3, "max_replicas": 2}}], "max_replicas must be >="),
        ([{"name": "has space"}], "/app/models/0/name"),
        ([{"name": "a", "engine": {"modle": "x"}}], "additional properties 'modle' not allowed"),
        ([{"name": "a", "replicas": 2}], "additional properties 'replicas' not allowed"),
    ],
)
def test_bad_models_fail_the_render(models: list, message: str) -> None:
    with pytest.raises((helm_python.HelmError, helm_python.HelmValuesError)) as err:
        render({"app": {"models": models}})
    assert message in str(err.value)


def test_tenants_model_lists_and_limits_reach_the_tenancy_file(all_options: Rendered) -> None:
    config_map = next(c for c in all_options.all("ConfigMap") if c["metadata"]["name"].endswith("-tenancy"))
    tenants = {t["id"]: t for t in yaml.safe_load(config_map["data"]["tenancy.yaml"])["tenants"]}
    assert tenants["globex"]["models"] == ["llama-3.2-1b-random"]
    assert tenants["acme"]["model_quotas"][0]["requests_per_minute"] == 6000
    values = ci_values("all-options-values.yaml")["tenancy"]
    data = {k: v for k, v in values.items() if k != "keys"} | {
        "key_salt": values["keys"]["key_salt"],
        "admin_key_hash": values["keys"]["admin_key_hash"],
        "tenants": [
            t | {"api_key_hashes": [f"hmac-sha256:{i:064x}"]} for i, t in enumerate(values["tenants"], 1)
        ],
    }
    tenancy = parse_tenancy_config(data)
    tenancy.check_models(m.name for m in AppConfig.model_validate(all_options.app_args).served_models)
    assert tenancy.for_model("llama-3.2-1b-random").tenant("acme").quotas.max_concurrent_requests == 128
    assert tenancy.for_model("llama-3.1-8b").tenant("acme").quotas.max_concurrent_requests == 64
    assert not tenancy.tenant("globex").may_use("llama-3.1-8b")


def test_tenant_model_fields_are_checked_by_the_schema() -> None:
    tenants = chart_defaults()["tenancy"]["tenants"]
    bad = [tenants[0] | {"model_quotas": [{"model": "a", "requests_per_minute": 0}]}, *tenants[1:]]
    with pytest.raises(helm_python.HelmValuesError, match="requests_per_minute"):
        render({"tenancy": {"tenants": bad}})
    bad = [tenants[0] | {"models": "a"}, *tenants[1:]]
    with pytest.raises(helm_python.HelmValuesError, match="models"):
        render({"tenancy": {"tenants": bad}})
