"""Serve's direct ingress: each router serves HTTP on a port of its own, without the proxy hop.

What Ray Serve 2.60 needs (``ray/serve/_private/constants.py``, ``controller.py``, ``replica.py``):

* ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` in the environment of every Ray process: the controller
  reads it at import (it then runs Serve's proxy on the head node only) and so does each router
  (it then opens its own HTTP server after its constructor). It must be set before Ray starts:
  workers inherit the raylet's environment, and Serve reads the flag once per process.
* Each router asks the controller for a port: the lowest free one of the node's range
  (``RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT`` 30000 to ``..._MAX_HTTP_PORT`` 31000), so the first
  router of a node listens on 30000, the next on 30001. It binds Serve's ``http_options.host``.
* A stopped router's port is held back for ``RAY_SERVE_PORT_QUARANTINE_S`` (150 s by default) so
  that HAProxy's old workers cannot send it to another app's replica. fairlane runs no HAProxy, so
  we set it to 0: a restarted router gets its node's first port back, the one the chart exposes.
* The proxy (``http_options.port``, 8000) still runs on the head node and still routes to the
  routers through Serve's handles; only the clients that use a router's own port skip it.
* A stopping router stays reachable for at least ``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S``
  (30 s) so that load balancers can deregister it, and ``/-/healthz`` on its port answers 503
  ``DRAINING`` meanwhile; Serve raises the router's ``graceful_shutdown_timeout_s`` to at least 35 s.
"""

from __future__ import annotations

import ipaddress

from ray.serve.context import _get_global_client

from cluster.edge.ingress import ROUTER_DEPLOYMENT

ENABLE_VAR = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
QUARANTINE_VAR = "RAY_SERVE_PORT_QUARANTINE_S"
FIRST_PORT = 30000  # RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT's default: the node's first router
LAST_PORT = 31000  # RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT's default


def direct_ingress_env(enabled: bool) -> dict[str, str]:
    """The variables every Ray process must see, before Ray starts, for ``direct_ingress``.

    Off sets nothing: an operator's own ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` (and the benchmark's,
    ``bench/router_data_path.py --direct-ingress``) still applies, as Serve's default did before
    the setting existed.
    """
    return {ENABLE_VAR: "1", QUARANTINE_VAR: "0"} if enabled else {}


def router_urls(app_name: str, host: str) -> list[str]:
    """The base URLs (``http://ip:port``) of the app's routers' own HTTP servers, as Serve's
    controller publishes them (its target groups, also at the dashboard's
    ``/api/serve/applications``). Empty when the cluster runs without direct ingress: its target
    groups then name the proxies. ``host`` is Serve's ``http_options.host``: a router bound to a
    loopback address is reached there, not at its node's address."""
    details = _get_global_client().get_serve_details()
    urls = []
    for group in details.get("target_groups", []):
        if group.get("app_name") != app_name or group.get("protocol") != "HTTP":
            continue
        for target in group.get("targets", []):
            if f"#{ROUTER_DEPLOYMENT}#" not in target.get("name", ""):
                continue  # a proxy (no router has a port yet, or direct ingress is off)
            ip = host if _is_loopback(host) else target["ip"]
            urls.append(f"http://{ip}:{target['port']}")
    return sorted(urls)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
