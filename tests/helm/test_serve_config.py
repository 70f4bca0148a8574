"""serveConfigV2: the rendered args are a valid ``cluster.config.AppConfig``, matching values and mounts."""

from __future__ import annotations

import ast
from pathlib import PurePosixPath

import helm_python
import pytest
from pydantic import BaseModel

from cluster.config import AppConfig, AutoscalingSettings, EngineSettings, ModelSettings
from cluster.router_settings import RouterAutoscalingSettings
from tests.helm.chart import ROOT, Rendered, chart, chart_defaults, ci_values, render

CHART_OWNED = {"tenancy_config", "redis_url", "host", "port"}


def test_application_points_at_build_app(rendered: Rendered) -> None:
    (app,) = rendered.serve_config["applications"]
    assert app["import_path"] == "cluster.app:build_app"
    module, func = app["import_path"].split(":")
    source = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    builders = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func]
    assert len(builders) == 1 and len(builders[0].args.args) == 1  # build_app(args)


def test_args_validate_as_app_config(rendered: Rendered) -> None:
    config = AppConfig.model_validate(rendered.app_args)
    assert config.host == "0.0.0.0"
    assert config.port == rendered.serve_config["http_options"]["port"]


@pytest.mark.parametrize("variant", ["default", "all-options"])
def test_args_carry_the_values_unchanged(variant: str) -> None:
    values = chart_defaults()["app"] if variant == "default" else ci_values("all-options-values.yaml")["app"]
    rendered = render(None if variant == "default" else ci_values("all-options-values.yaml"))
    config = AppConfig.model_validate(rendered.app_args)
    expected = AppConfig.model_validate({**values, **{k: rendered.app_args[k] for k in CHART_OWNED}})
    assert config == expected
    # Helm drops a null value's key (AppConfig reads an absent field as its None default).
    assert set(rendered.app_args) == {k for k, v in values.items() if v is not None} | CHART_OWNED


def test_tenancy_config_path_is_the_mounted_merged_file(rendered: Rendered) -> None:
    path = PurePosixPath(rendered.app_args["tenancy_config"])
    for where, container, _ in rendered.containers():
        if container["name"].startswith("ray-"):
            mounts = {m["name"]: m for m in container["volumeMounts"]}
            assert PurePosixPath(mounts["tenancy"]["mountPath"]) == path.parent, where
        if container["name"] == "tenancy-config":
            assert container["command"][container["command"].index("--out") + 1] == str(path), where


def test_redis_url_points_at_the_quota_database_without_credentials(default: Rendered) -> None:
    url = default.app_args["redis_url"]
    assert url == "redis://fl-fairlane-redis.llm.svc:6379/1"
    assert "@" not in url  # the password comes from the Secret, never the RayService


def test_serve_http_options_and_proxy(all_options: Rendered) -> None:
    serve = all_options.serve_config
    assert serve["http_options"] == {"host": "0.0.0.0", "port": 8080}
    assert serve["proxy_location"] == "EveryNode"
    assert serve["applications"][0]["name"] == "fairlane-ci"


def test_autoscaling_reaches_the_replica_deployment_args(all_options: Rendered) -> None:
    auto = AppConfig.model_validate(all_options.app_args).autoscaling
    assert auto is not None
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (2, 8, 6.0)
    assert auto.initial_replicas == 3
    config = AppConfig.model_validate(all_options.app_args)
    assert config.graceful_shutdown_s == 600.0  # the stop bound of replicas and routers
    assert AppConfig.model_validate(render().app_args).replica_graceful_shutdown_s is None  # derived
    fixed = render({"app": {"autoscaling": None, "num_replicas": 3}})
    config = AppConfig.model_validate(fixed.app_args)
    assert config.autoscaling is None and config.num_replicas == 3


def _resolved(node: dict, schema: dict) -> dict:
    if "$ref" in node:
        return schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


@pytest.mark.parametrize(
    ("path", "model", "owned"),
    [
        (("app",), AppConfig, CHART_OWNED),
        (("app", "engine"), EngineSettings, set()),
        (("app", "autoscaling"), AutoscalingSettings, set()),
        (("app", "router_autoscaling"), RouterAutoscalingSettings, set()),
        (("app", "models", "[]"), ModelSettings, set()),
        (("app", "models", "[]", "engine"), EngineSettings, set()),
        (("app", "models", "[]", "autoscaling"), AutoscalingSettings, set()),
    ],
)
def test_values_schema_mirrors_app_config_fields(
    path: tuple[str, ...], model: type[BaseModel], owned: set[str]
) -> None:
    """Every AppConfig field is settable from values, except the four the chart owns, and nothing else
    ("[]": a list's items)."""
    schema = chart().schema
    assert schema is not None
    node = schema
    for key in path:
        node = _resolved(node["items"] if key == "[]" else node["properties"][key], schema)
    assert set(node["properties"]) == set(model.model_fields) - owned
    assert node["additionalProperties"] is False


@pytest.mark.parametrize("field", sorted(CHART_OWNED))
def test_chart_owned_fields_cannot_be_set_in_values(field: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=field):
        render({"app": {field: "x"}})


def test_field_limits_match_app_config() -> None:
    """The schema's limits agree with AppConfig's: a value one side rejects, the other does too."""
    cases = [
        ({"num_replicas": 0}, "num_replicas"),
        ({"default_max_tokens": 0}, "default_max_tokens"),
        ({"autoscaling": {"target_ongoing_requests": 0}}, "target_ongoing_requests"),
        ({"engine": {"max_model_len": 1}}, "max_model_len"),
        ({"replica_room": 0}, "replica_room"),
    ]
    for app, field in cases:
        with pytest.raises(helm_python.HelmValuesError, match=field):
            render({"app": app})
        with pytest.raises(ValueError, match=field):
            AppConfig.model_validate(app)
