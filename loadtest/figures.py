"""PNG figures of one run (and of two runs side by side); matplotlib with the Agg backend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers; must precede pyplot
import matplotlib.pyplot as plt
import numpy as np

from loadtest.metrics import tpot, ttft
from loadtest.records import RequestRecord

DPI = 110


def _tenants(records: Sequence[RequestRecord]) -> list[str]:
    return sorted({r.tenant for r in records})


def _cdf(ax, values: list[float], **kw) -> None:
    if not values:
        return
    xs = np.sort(values)
    ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", **kw)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def latency_cdf(records: Sequence[RequestRecord], metric: str, targets: dict[str, float], path: Path) -> Path:
    """CDF per tenant of TTFT or TPOT (ms, log x), with each tenant's class target as a dashed line."""
    fn = ttft if metric == "ttft" else tpot
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    for i, tenant in enumerate(_tenants(records)):
        rs = [r for r in records if r.tenant == tenant and r.ok and not r.warmup]
        vals = [v * 1000 for r in rs if (v := fn(r)) is not None]
        color = f"C{i}"
        _cdf(ax, vals, color=color, label=f"{tenant} (n={len(vals)})")
        if rs and rs[0].sla_class in targets:
            ax.axvline(
                targets[rs[0].sla_class] * 1000, color=color, ls="--", lw=1, label=f"{rs[0].sla_class} target"
            )
    ax.set_xscale("log")
    ax.set_xlabel(f"{metric.upper()} (ms, log scale)")
    ax.set_ylabel("fraction of successful requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{metric.upper()} CDF per tenant")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, path)


def service_share(fairness: dict, path: Path) -> Path:
    """Stacked share of weighted service (in×1 + out×2, ÷ weight) per time window."""
    edges = np.asarray(fairness["edges"])
    mids = (edges[:-1] + edges[1:]) / 2
    names = list(fairness["service"])
    rows = np.array([fairness["service"][t] for t in names]) if names else np.zeros((0, len(mids)))
    totals = rows.sum(axis=0)
    shares = np.divide(rows, totals, out=np.zeros_like(rows), where=totals > 0) * 100
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bottom = np.zeros(len(mids))
    for i, (name, row) in enumerate(zip(names, shares, strict=True)):
        # One bar per window: the share is a per-window figure, not a curve between windows.
        ax.bar(mids, row, width=fairness["window_s"], bottom=bottom, label=name, color=f"C{i}", alpha=0.85)
        bottom += row
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("share of weighted service (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Service share over time ({fairness['window_s']:.1f} s windows)")
    ax.legend(fontsize=8, loc="upper right")
    return _save(fig, path)


def sla_attainment(classes: dict, path: Path) -> Path:
    """Share of served requests meeting every target of their class, one bar per class."""
    names = list(classes)
    values = [100 * (classes[c]["sla_attainment"] or 0.0) for c in names]
    fig, ax = plt.subplots(figsize=(6, 4))
    bars = ax.bar(names, values, color=[f"C{i}" for i in range(len(names))])
    for bar, c in zip(bars, names, strict=True):
        g = classes[c]
        ax.annotate(
            f"{g['slo_met']}/{g['requests'] - g['rejected']}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylim(0, 105)
    ax.set_xlabel("SLA class")
    ax.set_ylabel("SLA attainment (% of served requests)")
    ax.set_title("SLA attainment per class (TTFT, TPOT and E2E targets all met)")
    return _save(fig, path)


def throughput(tl: dict, path: Path) -> Path:
    """Output tokens per second per tenant (and in total) over time."""
    edges = np.asarray(tl["edges"])
    mids = (edges[:-1] + edges[1:]) / 2
    fig, ax = plt.subplots(figsize=(7, 4.2))
    total = np.zeros(len(mids))
    for tenant, row in tl["output_tps"].items():
        ax.plot(mids, row, marker=".", label=tenant)
        total += np.asarray(row)
    ax.plot(mids, total, color="black", ls="--", label="all tenants")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Output throughput over time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def rejections(tenants: dict, path: Path) -> Path:
    """Non-ok endings per tenant, stacked by error type (429 rejections, timeouts, 5xx...)."""
    names = list(tenants)
    kinds = sorted({k for t in names for k in tenants[t]["errors"]})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bottom = np.zeros(len(names))
    for i, kind in enumerate(kinds):
        vals = np.array([tenants[t]["errors"].get(kind, 0) for t in names], dtype=float)
        ax.bar(names, vals, bottom=bottom, label=kind, color=f"C{i}")
        bottom += vals
    ok = [tenants[t]["ok"] for t in names]
    for x, (b, n) in enumerate(zip(bottom, ok, strict=True)):
        ax.annotate(f"ok {n}", (x, b), ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("tenant")
    ax.set_ylabel("requests not ok (count)")
    ax.set_title("Rejections and errors per tenant" + ("" if kinds else " (none)"))
    if kinds:
        ax.legend(fontsize=8)
    ax.set_ylim(0, max(1.0, float(bottom.max()) * 1.15 if len(bottom) else 1.0))
    return _save(fig, path)


def ttft_compare(
    a: Sequence[RequestRecord], b: Sequence[RequestRecord], labels: tuple[str, str], path: Path
) -> Path:
    """TTFT CDF per tenant, run A solid, run B dashed."""
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    for i, tenant in enumerate(sorted({r.tenant for r in (*a, *b)})):
        for recs, ls, label in ((a, "-", labels[0]), (b, "--", labels[1])):
            vals = [
                v * 1000
                for r in recs
                if r.tenant == tenant and r.ok and not r.warmup and (v := ttft(r)) is not None
            ]
            _cdf(ax, vals, color=f"C{i}", ls=ls, label=f"{tenant} · {label} (n={len(vals)})")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("fraction of successful requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"TTFT CDF: {labels[0]} (solid) vs {labels[1]} (dashed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, path)


def run_figures(records: Sequence[RequestRecord], summary: dict, out: Path) -> list[Path]:
    """All single-run figures into ``out``; returns their paths in report order."""
    out.mkdir(parents=True, exist_ok=True)
    targets_ttft = {c: t["ttft_target_s"] for c, t in summary["sla_targets"].items()}
    targets_tpot = {c: t["tpot_target_s"] for c, t in summary["sla_targets"].items()}
    return [
        latency_cdf(records, "ttft", targets_ttft, out / "ttft_cdf.png"),
        latency_cdf(records, "tpot", targets_tpot, out / "tpot_cdf.png"),
        service_share(summary["fairness"], out / "service_share.png"),
        sla_attainment(summary["classes"], out / "sla_attainment.png"),
        throughput(summary["timeline"], out / "throughput.png"),
        rejections(summary["tenants"], out / "rejections.png"),
    ]
