"""The application builder: validate the config once, then compose the Serve deployments.

    serve run cluster.app:build_app                       # defaults: SmolLM2 on CPU, demo tenants
    serve run cluster.app:build_app engine.device=cpu     # not supported: pass a dict or a config file
    serve.run(build_app({"num_replicas": 2}))

``args`` is an ``AppConfig`` as a dict; a ``config_file`` key names a YAML file whose contents
the other keys override.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from ray import serve
from ray.serve.config import AutoscalingConfig, AutoscalingPolicy, RequestRouterConfig

from cluster.config import AppConfig, load_app_config
from cluster.edge.ingress import ROUTER_DEPLOYMENT, Ingress
from cluster.model_settings import EngineSettings, ModelSettings
from cluster.routing.kv_router import KVAwareRouter
from cluster.serving.engine_load_policy import engine_requests_policy
from cluster.serving.replica_deployment import ReplicaServer
from cluster.serving.sla_serve_policy import SlaServePolicy, policy_kwargs

ROUTING_STATS_PERIOD_S = 0.5
# How often a stopping replica counts its in-flight requests (Serve's default is 2 s): it exits, and
# gives its GPU back, this soon after its last stream ends.
SHUTDOWN_WAIT_LOOP_S = 0.5


def replica_gpus(model: ModelSettings) -> float:
    """1 GPU per replica when CUDA is present (checked on the driver), else 0, unless configured."""
    if model.replica_num_gpus is not None:
        return model.replica_num_gpus
    if model.engine.device == "cpu":
        return 0.0
    import torch

    return 1.0 if torch.cuda.is_available() else 0.0


def replica_options(config: AppConfig, model: ModelSettings | None = None) -> dict[str, Any]:
    """Serve options of one model's replica deployment (None: the first model's): resources,
    scaling and the KV-aware router."""
    model = model or config.served_models[0]
    opts: dict[str, Any] = {
        "name": config.deployments[model.name],
        "ray_actor_options": {"num_cpus": model.replica_num_cpus, "num_gpus": replica_gpus(model)},
        "max_ongoing_requests": model.replica_max_ongoing,
        "request_router_config": RequestRouterConfig(
            request_router_class=KVAwareRouter,
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
            request_routing_stats_timeout_s=5.0,
            request_router_kwargs={"replica_choice": config.replica_choice},
        ),
        "health_check_period_s": 5.0,
        **graceful_shutdown(config),
        "logging_config": serve_logging(config),
    }
    a = model.autoscaling
    if a is None:
        opts["num_replicas"] = model.num_replicas
    else:
        first = a.initial_replicas or a.min_replicas
        policy = replica_policy(config, model)
        opts["autoscaling_config"] = serve_autoscaling(a.min_replicas, a.max_replicas, first, a, policy)
    return opts


def replica_policy(config: AppConfig, model: ModelSettings) -> AutoscalingPolicy | Callable | None:
    """The replicas' custom policy: the SLA policy (``autoscaling.policy: sla``); else, with direct
    dispatch, whose requests never pass Serve's handle, the engines' own counts; else Serve's."""
    a = model.autoscaling
    if a is not None and a.policy == "sla":
        kwargs = policy_kwargs(a.sla, a, "cpu" if replica_gpus(model) == 0 else "cuda")
        return AutoscalingPolicy(policy_function=SlaServePolicy, policy_kwargs=kwargs)
    return engine_requests_policy if config.direct_dispatch else None


def serve_autoscaling(
    least: int, most: int, first: int, pace: Any, policy: AutoscalingPolicy | Callable | None = None
) -> AutoscalingConfig:
    """Serve's autoscaling of a deployment (replicas or routers); ``pace`` gives the target ongoing
    requests, the delays and the report interval; ``policy``: a custom policy function (Serve's
    default policy when None)."""
    if isinstance(policy, AutoscalingPolicy):
        extra = {"policy": policy}
    else:
        extra = {"policy": AutoscalingPolicy(policy_function=policy)} if policy is not None else {}
    return AutoscalingConfig(
        min_replicas=least,
        max_replicas=most,
        initial_replicas=first,
        target_ongoing_requests=pace.target_ongoing_requests,
        upscale_delay_s=pace.upscale_delay_s,
        downscale_delay_s=pace.downscale_delay_s,
        metrics_interval_s=pace.metrics_interval_s,
        look_back_period_s=max(2.0, 4 * pace.metrics_interval_s),
        **extra,
    )


def graceful_shutdown(config: AppConfig) -> dict[str, Any]:
    """How a stopping replica (or router) ends: Serve routes nothing new to it, waits up to the bound
    for its in-flight requests, then kills it. A bound shorter than an answer cuts that answer."""
    return {
        "graceful_shutdown_timeout_s": config.graceful_shutdown_s,
        "graceful_shutdown_wait_loop_s": SHUTDOWN_WAIT_LOOP_S,
    }


def serve_logging(config: AppConfig) -> dict[str, Any]:
    """Serve's logging of a deployment: the per-request access line only when asked for."""
    return {"enable_access_log": config.serve_access_log}


# Serve reads it when a replica's process starts: set in the router actors' environment only.
USER_CODE_THREAD_VAR = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"


def router_actor_options(config: AppConfig) -> dict[str, Any]:
    """Ray options of a router actor: no CPU reserved; its code on Serve's loop when asked."""
    options: dict[str, Any] = {"num_cpus": 0}
    if config.router_on_serve_loop:
        options["runtime_env"] = {"env_vars": {USER_CODE_THREAD_VAR: "0"}}
    return options


def router_count(config: AppConfig) -> dict[str, Any]:
    """A fixed number of routers, or Serve autoscaling of them on their ongoing requests."""
    a = config.router_autoscaling
    if a is None:
        return {"num_replicas": config.num_routers}
    return {"autoscaling_config": serve_autoscaling(a.min_routers, a.max_routers, a.first, a)}


def router_options(config: AppConfig) -> dict[str, Any]:
    """Serve options of the ingress (router) deployment."""
    return {
        "name": ROUTER_DEPLOYMENT,
        **router_count(config),
        "ray_actor_options": router_actor_options(config),
        "max_ongoing_requests": 10_000,
        # A router holds each client's stream until the replica's ends: it may not stop sooner.
        **graceful_shutdown(config),
        "logging_config": serve_logging(config),
    }


def engine_kwargs(engine: EngineSettings, gpu_share: float | None = None) -> dict[str, Any]:
    """``replica.EngineConfig`` keyword arguments from the engine settings; ``gpu_share``: the part
    of a card each replica gets (a fractional ``replica_num_gpus``), which bounds its KV pool."""
    e = engine
    return {
        "gpu_memory_share": gpu_share,
        "model": e.model,
        "device": e.device,
        "mode": e.mode,
        "random_weights": e.random_weights,
        "kv_cache_tokens": e.kv_cache_tokens,
        "max_num_seqs": e.max_num_seqs,
        "max_num_batched_tokens": e.max_num_batched_tokens,
        "max_model_len": e.max_model_len,
        "enable_prefix_caching": e.enable_prefix_caching,
        "quantization": e.quantization,
        "fp8_skip_modules": tuple(e.fp8_skip_modules),
        "kv_cache_dtype": e.kv_cache_dtype,
    } | _lora_kwargs(e)


def _lora_kwargs(e: EngineSettings) -> dict[str, Any]:
    """LoRA's settings, where it is on (an engine without slots takes none)."""
    if not e.lora_slots:
        return {}
    adapters = tuple(sorted(e.lora_adapters.items()))
    return {"lora_slots": e.lora_slots, "max_lora_rank": e.max_lora_rank, "lora_adapters": adapters}


StandIn = serve.Application | Callable[[str], serve.Application]


def compose(config: AppConfig, replicas: StandIn | None = None) -> serve.Application:
    """The bound application: the ingress (routers) holding a handle to each model's replicas.

    ``replicas``: another bound replica deployment with ``ReplicaServer``'s methods (the router
    benchmark's paced stand-in) for a one-model config, or a function of the deployment's
    generation that binds one; None = the engine replicas of ``config``.
    """
    # A new id per deployment: the routers of this one share their tenancy version, and a reload made
    # on an earlier deployment of the app does not reach it (cluster/routing/tenancy_board.py); its replicas
    # publish their loads under it (cluster/serving/replica_board.py).
    generation = uuid.uuid4().hex[:12]
    if replicas is not None:
        if len(config.served_models) != 1:
            raise ValueError("a stand-in replica deployment serves a one-model config only")
        pools = {config.served_model_name: replicas(generation) if callable(replicas) else replicas}
    else:
        pools = {m.name: replica_pool(config, m, generation) for m in config.served_models}
    # Serve finds the bound deployments inside the dict and hands the router a handle for each.
    return serve.deployment(Ingress, **router_options(config)).bind(pools, config.model_dump(), generation)


def replica_pool(config: AppConfig, model: ModelSettings, generation: str) -> serve.Application:
    """One model's replica deployment, bound to its engine settings."""
    engine = model.engine
    sla = model.autoscaling is not None and model.autoscaling.policy == "sla"
    return serve.deployment(ReplicaServer, **replica_options(config, model)).bind(
        engine_kwargs(engine, gpu_share(model)),
        engine.synthetic_tokenizer,
        generation,
        model.name,
        config.direct_dispatch,
        sla,
        config.graceful_shutdown_s,
    )


def gpu_share(model: ModelSettings) -> float | None:
    """A replica's part of one card when several share it (0 < ``replica_num_gpus`` < 1), else None."""
    gpus = model.replica_num_gpus
    return gpus if gpus is not None and 0 < gpus < 1 else None


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """Validate ``args`` (an ``AppConfig`` dict, optionally with ``config_file``) and compose the app."""
    args = dict(args or {})
    config = load_app_config(args.pop("config_file", None), args)
    return compose(config)
