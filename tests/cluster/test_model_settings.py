"""Several models in one AppConfig (no Ray): the one-model form, what a `models` entry takes from the
top level, names, and the Serve options of each model's deployment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.app import compose, replica_options
from cluster.config import AppConfig

TWO = {
    "engine": {"device": "cpu", "kv_cache_tokens": 2048, "max_model_len": 1024},
    "num_replicas": 2,
    "replica_room": 4,
    "models": [
        {"name": "chat"},
        {
            "name": "org/bench",
            "engine": {"model": "llama-3.2-1b", "random_weights": True, "max_model_len": 4096},
            "autoscaling": {"min_replicas": 1, "max_replicas": 3},
            "replica_room": 16,
        },
    ],
}


def test_the_one_model_form_is_the_one_element_case() -> None:
    config = AppConfig(engine={"device": "cpu"}, num_replicas=2, served_model_name="mine")
    (model,) = config.served_models
    assert (model.name, model.engine, model.num_replicas) == ("mine", config.engine, 2)
    assert model.replica_room is None  # unset: the engine's slots
    assert config.deployments == {"mine": "Replica"}
    # A copy with another top-level value serves that value (the CLI's profile changes the room so).
    assert config.model_copy(update={"replica_room": 3}).served_models[0].replica_room == 3
    assert AppConfig(served_model_name="any name at all").served_models[0].name == "any name at all"


def test_an_entry_takes_what_it_does_not_give_from_the_top_level() -> None:
    config = AppConfig.model_validate(TWO)
    chat, bench = config.served_models
    assert chat.engine == config.engine and (chat.num_replicas, chat.autoscaling, chat.replica_room) == (
        2,
        None,
        4,
    )
    assert bench.engine.model_dump() == config.engine.model_dump() | {
        "model": "llama-3.2-1b",
        "random_weights": True,
        "max_model_len": 4096,
    }
    assert bench.autoscaling is not None and bench.autoscaling.max_replicas == 3 and bench.replica_room == 16
    assert config.served_model_name == "chat" and config.deployments == {
        "chat": "Replica",
        "org/bench": "Replica-org_bench",
    }
    # The routers get the config as a dump: it resolves to the same models.
    assert AppConfig.model_validate(config.model_dump()) == config
    assert config.graceful_shutdown_s == config.first_token_timeout_s + 4096 / 10  # the longest context


def test_a_fixed_count_in_an_entry_means_no_autoscaling() -> None:
    data = TWO | {
        "autoscaling": {"max_replicas": 4},
        "models": [{"name": "a"}, {"name": "b", "num_replicas": 1}],
    }
    a, b = AppConfig.model_validate(data).served_models
    assert a.autoscaling is not None and a.autoscaling.max_replicas == 4
    assert (b.autoscaling, b.num_replicas) == (None, 1)


@pytest.mark.parametrize(
    ("models", "extra", "message"),
    [
        ([{"name": "a"}, {"name": "a"}], {}, "models.1.name: duplicate model name 'a'"),
        (
            [{"name": "a"}, {"name": "b/c"}, {"name": "b_c"}],
            {},
            "make the same deployment name 'Replica-b_c'",
        ),
        ([{"name": "a b"}], {}, "models.0.name"),
        ([{"name": "a", "replicas": 2}], {}, "models.0.replicas"),
        ([{"name": "a"}], {"served_model_name": "b"}, "served_model_name: 'b' is not one of the models"),
    ],
)
def test_bad_model_lists_are_refused(models: list, extra: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(")):
        AppConfig.model_validate({"models": models} | extra)


def test_each_model_gets_its_own_deployment_options() -> None:
    config = AppConfig.model_validate(TWO)
    chat, bench = (replica_options(config, m) for m in config.served_models)
    assert (chat["name"], chat["num_replicas"], chat["max_ongoing_requests"]) == ("Replica", 2, 13)
    assert chat["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.0}  # device cpu
    assert bench["name"] == "Replica-org_bench" and bench["autoscaling_config"].max_replicas == 3
    assert bench["max_ongoing_requests"] == 28 and "num_replicas" not in bench
    assert replica_options(config) == chat  # None: the first model's


def test_a_stand_in_replica_serves_a_one_model_config_only() -> None:
    with pytest.raises(ValueError, match="one-model config"):
        compose(AppConfig.model_validate(TWO), replicas=object())  # type: ignore[arg-type]


def test_an_override_sets_one_nested_field_and_keeps_the_rest(tmp_path) -> None:
    from cluster.config import load_app_config

    path = tmp_path / "app.yaml"
    path.write_text("engine:\n  model: llama-3.2-1b\n  max_num_seqs: 48\n", encoding="utf-8")
    config = load_app_config(path, {"engine.late_launch": False, "num_replicas": 3})
    assert (config.engine.model, config.engine.max_num_seqs, config.engine.late_launch) == (
        "llama-3.2-1b", 48, False,
    )  # fmt: skip
    assert config.num_replicas == 3
    assert load_app_config(None, {"engine.late_launch": True}).engine.late_launch is True
    with pytest.raises(ValidationError, match="no_such_field"):
        load_app_config(path, {"engine.no_such_field": 1})
