"""The Grafana dashboard: valid JSON whose queries use the metrics and labels that
cluster/telemetry/metrics.py exports."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.utils import floatToGoString

from cluster.telemetry.metrics import LATENCY_BUCKETS, ClusterMetrics
from tests.helm.chart import Rendered, chart_defaults, ci_values, render

METRIC = re.compile(r"\bfairlane_[a-z0-9_]+\b")
BY = re.compile(r"\bby \(([^)]*)\)")


def _exported() -> dict[str, set[str]]:
    """Exposition names of ClusterMetrics (with _total/_bucket/... suffixes) and their label names."""
    names: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    metrics = [m for m in vars(ClusterMetrics()).values() if isinstance(m, Counter | Gauge | Histogram)]
    assert len(metrics) > 10
    for collector in metrics:
        for family in collector.describe():
            labels = set(getattr(collector, "_labelnames", ()))
            for suffix in suffixes[family.type]:
                names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def _dashboard(rendered: Rendered) -> dict:
    config_map = next(c for c in rendered.all("ConfigMap") if c["metadata"]["name"].endswith("-dashboard"))
    return json.loads(config_map["data"]["fairlane-dashboard.json"])


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


@pytest.fixture(scope="module")
def dashboard_on() -> Rendered:
    return render({"metrics": {"grafanaDashboard": {"enabled": True}}})


def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar(all_options: Rendered) -> None:
    config_map = all_options.one("ConfigMap", "fl-ci-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"]["grafana_folder"] == "LLM serving"


def test_dashboard_has_the_required_panels(dashboard_on: Rendered) -> None:
    titles = " | ".join(p["title"] for p in _dashboard(dashboard_on)["panels"])
    for needed in (
        "TTFT per tenant",
        "TPOT per tenant",
        "SLA attainment",
        "queue depth",
        "GPU busy",
        "KV cache usage",
        "Prefix cache hit rate per tenant",
        "Prefix cache hit rate per replica",
        "Cached prompt tokens",
        "evictions",
    ):
        assert needed in titles


def test_tenant_hit_rate_divides_cached_by_served_prompt_tokens(dashboard_on: Rendered) -> None:
    panel = next(
        p for p in _dashboard(dashboard_on)["panels"] if p["title"] == "Prefix cache hit rate per tenant"
    )
    (expr,) = [t["expr"] for t in panel["targets"]]
    cached, served = expr.split(" / ")
    assert "fairlane_cached_prompt_tokens_total" in cached and "by (tenant)" in cached
    assert "fairlane_prompt_tokens_total" in served and "by (tenant)" in served


def test_panels_do_not_overlap(dashboard_on: Rendered) -> None:
    cells = set()
    for panel in _dashboard(dashboard_on)["panels"]:
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, panel["title"]
        cells |= mine


def test_every_query_uses_exported_metrics_and_labels(dashboard_on: Rendered) -> None:
    exported = _exported()
    exprs = _exprs(_dashboard(dashboard_on))
    assert exprs and all("__SLA_ATTAINMENT_EXPR__" not in e for e in exprs)
    for expr in exprs:
        metrics = set(METRIC.findall(expr))
        assert metrics, expr
        assert metrics <= set(exported), metrics - set(exported)
        labels = set().union(*(exported[m] for m in metrics))
        for group in BY.findall(expr):
            used = {label.strip() for label in group.split(",")}
            assert used <= labels, (expr, used - labels)


@pytest.mark.parametrize("variant", ["default", "all-options"])
def test_sla_attainment_uses_each_class_target_bucket(
    variant: str, dashboard_on: Rendered, all_options: Rendered
) -> None:
    rendered = dashboard_on if variant == "default" else all_options
    classes = (chart_defaults() if variant == "default" else ci_values("all-options-values.yaml"))["tenancy"][
        "sla_classes"
    ]
    (expr,) = [e for e in _exprs(_dashboard(rendered)) if "fairlane_ttft_seconds_count" in e]
    for sla in classes:
        le = floatToGoString(float(sla["ttft_target_s"]))  # how prometheus_client writes the bucket label
        assert f'fairlane_ttft_seconds_bucket{{sla_class="{sla["name"]}",le="{le}"' in expr
    assert expr.count(" or ") == len(classes) - 1


def test_default_sla_targets_are_ttft_bucket_boundaries() -> None:
    """Attainment from the histogram is exact only when a class's TTFT target is a bucket boundary."""
    for sla in chart_defaults()["tenancy"]["sla_classes"]:
        assert sla["ttft_target_s"] in LATENCY_BUCKETS, sla["name"]
