"""Starting the app on this machine (CLI, demo, benchmarks): local Ray, Serve on a port, then shutdown."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray
from ray import serve

from cluster.app import StandIn, compose, serve_logging
from cluster.config import AppConfig
from cluster.drain import drain
from cluster.edge.ingress import ROUTER_DEPLOYMENT
from cluster.ops.edge import HAPROXY_VAR, SIDE_PORT_VARS, edge_env, free_side_ports, usable_edge
from cluster.ops.edge_error_file import write_error_file
from cluster.routing.replica_monitor import running_replicas

log = logging.getLogger(__name__)

APP_NAME = "fairlane"
REPO_ROOT = str(Path(__file__).resolve().parents[1])
START_TIMEOUT_S = 300.0
# Serve keeps a stopping router reachable this long (30 s by default) so that load balancers can
# take it out before it goes; a redeploy waits for the old routers to stop.
ROUTER_DRAIN_WINDOW_VAR = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
# Serve's controller kills a proxy (or HAProxy manager) that has not answered its first ready check
# within this many seconds (5 by default), and `serve.start` then fails on the dead actor. On a busy
# 2-core machine (beside two busy loops) a new proxy's worker start and imports took longer, and Serve
# did not start. A proxy still starting is not an unhealthy one: give it a minute.
PROXY_READY_VAR = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
PROXY_READY_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_router_drain_window(seconds: float = 2.0) -> None:
    """For a cluster whose only load balancer is its own (the demo, the policy benchmark) and which
    sends nothing while it redeploys: a stopping router stays reachable ``seconds``, not Serve's 30.
    Set before Ray starts (its processes inherit it; Serve reads it once, at import); a value the
    user set wins."""
    os.environ.setdefault(ROUTER_DRAIN_WINDOW_VAR, f"{seconds:g}")


def ray_env(proxy_grpc: bool | None = True, config: AppConfig | None = None) -> None:
    """The environment a Ray started from this process hands to every process it starts.

    Workers must import ``cluster`` from this checkout. ``proxy_grpc``: Serve's HTTP proxy reaches
    the routers over gRPC (RAY_SERVE_PROXY_USE_GRPC); ``config``: the app whose ``edge`` (and
    ``direct_ingress``) decide how clients reach the routers (``cluster/ops/edge.py``), HAProxy's
    side ports taken free on this machine and its error file written here. None leaves a variable
    as it is.
    """
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault(PROXY_READY_VAR, f"{PROXY_READY_S:g}")  # a value the user set wins
    if proxy_grpc is not None:
        os.environ["RAY_SERVE_PROXY_USE_GRPC"] = "1" if proxy_grpc else "0"
    if config is not None:
        for name in (HAPROXY_VAR, *SIDE_PORT_VARS):  # a proxy edge after a HAProxy one in this process
            os.environ.pop(name, None)
        kind = usable_edge(config.edge)
        if kind == "haproxy":  # free side ports, and fairlane's JSON 503 for what HAProxy answers itself
            os.environ.update(edge_env(kind, config.direct_ingress, free_side_ports(), write_error_file()))
        else:
            os.environ.update(edge_env(kind, config.direct_ingress))


def start_ray(
    address: str | None, num_cpus: int | None = None, proxy_grpc: bool = True, config: AppConfig | None = None
) -> None:
    """Join ``address`` or start a local Ray. A joined cluster keeps its own proxy and edge settings
    (the chart sets RAY_SERVE_PROXY_USE_GRPC and the edge's variables in the pods' env)."""
    if address is None:
        ray_env(proxy_grpc, config)
    else:
        ray_env(None, None)
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "ignore_reinit_error": True}
    if address is None:
        kwargs["num_cpus"] = num_cpus or max(4, os.cpu_count() or 1)
    ray.init(address=address, **kwargs)


def deploy(config: AppConfig, name: str = APP_NAME, replicas: StandIn | None = None) -> str:
    """Run the app and wait until it is RUNNING; returns its base URL."""
    # The global logging config reaches the proxy: its access line per request is CPU too.
    serve.start(http_options={"host": config.host, "port": config.port}, logging_config=serve_logging(config))
    serve.run(compose(config, replicas), name=name, route_prefix="/", blocking=False)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        status = serve.status().applications.get(name)
        if status is not None and status.status == "RUNNING":
            return f"http://{config.host}:{config.port}"
        if status is not None and status.status == "DEPLOY_FAILED":
            raise RuntimeError(f"the app failed to deploy: {status.message}")
        time.sleep(0.5)
    raise TimeoutError(f"the app did not start within {START_TIMEOUT_S:.0f}s")


@contextlib.contextmanager
def local_cluster(
    config: AppConfig,
    address: str | None = None,
    on_ray_up: Callable[[], None] | None = None,
    replicas: StandIn | None = None,
) -> Iterator[str]:
    """Ray + Serve + the app for the duration of the block; everything is shut down after.

    ``replicas``: a stand-in replica deployment (see ``cluster.app.compose``); None = the engine's.

    ``on_ray_up`` runs after ``ray.init`` and before Serve opens its port: the one moment a caller
    can put its own signal handlers in place of Ray's before any request can arrive.
    """
    was_up = ray.is_initialized()
    start_ray(address, proxy_grpc=config.proxy_grpc, config=config)
    owns_ray = not was_up and started_head_node()
    try:
        if on_ray_up is not None:
            on_ray_up()
        yield deploy(config, replicas=replicas)
        # Leaving the block normally (SIGTERM or Ctrl-C in ``fairlane serve``, the end of a demo):
        # stop admitting (503 + Retry-After) and let in-flight streams finish, within the drain time.
        routers = running_replicas(APP_NAME, ROUTER_DEPLOYMENT) or config.initial_routers  # autoscaled: now
        drained = drain(APP_NAME, routers, config.drain_timeout_s)
        log.info("drain %s", "complete" if drained else f"cut short after {config.drain_timeout_s:.0f}s")
    finally:
        stop_serve_and_ray(owns_ray)


def started_head_node() -> bool:
    """Whether this process's ``ray.init`` started its Ray (rather than joining one: ``--address``,
    RAY_ADDRESS or a ``ray start`` cluster). Ray has no public flag for it; without the private one
    the answer is False, which keeps the joined-cluster shutdown."""
    node = getattr(ray._private.worker, "_global_node", None)
    return bool(node is not None and getattr(node, "is_head", lambda: False)())


def redeploy(config: AppConfig) -> str:
    """The app again under its name with ``config`` (Serve is up): Serve replaces its routers and
    replicas and returns once the new ones run. Cheaper than a second Ray and Serve start."""
    serve.run(compose(config), name=APP_NAME, route_prefix="/")
    return f"http://{config.host}:{config.port}"


def stop_serve_and_ray(owns_ray: bool) -> None:
    """Serve, then this driver's Ray. A Ray this process started is ended whole by ``ray.shutdown``
    (Serve's controller, proxy and replicas with it), so Serve is not stopped first: its
    ``serve.shutdown`` asks the controller to kill itself from inside a task Ray retries forever,
    and Ray reports that death to the driver as a line of noise ("Task
    ServeController.graceful_shutdown failed ... killed by `ray.kill`"). A joined cluster outlives
    us: Serve is shut down there as before."""
    if not owns_ray:
        serve.shutdown()
    ray.shutdown()
