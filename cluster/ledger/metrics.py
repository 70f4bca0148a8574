"""The ledger's Prometheus series, read from the writer at scrape time (nothing on the request path)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from cluster.ledger.writer import LedgerWriter


class _WriteErrors(Collector):
    """A counter whose value the writer keeps (a Counter object would need an inc on every error)."""

    def __init__(self, writer: LedgerWriter) -> None:
        self._writer = writer

    def collect(self):
        family = CounterMetricFamily(
            "fairlane_ledger_write_errors", "Ledger writes the database refused or never answered."
        )
        family.add_metric([], self._writer.write_errors)
        yield family


def register(registry: CollectorRegistry, writer: LedgerWriter) -> None:
    """Pending, spilled and dropped rows, write errors and the age of the last write, on ``registry``."""
    Gauge(
        "fairlane_ledger_pending_rows", "Rows queued in memory for the ledger database.", registry=registry
    ).set_function(lambda: writer.pending_rows)
    Gauge(
        "fairlane_ledger_spilled_rows", "Rows in this router's local spill file.", registry=registry
    ).set_function(lambda: writer.spill.waiting)
    Gauge(
        "fairlane_ledger_dropped_rows",
        "Rows dropped: the hand-over queue was full, or a row came after the close.",
        registry=registry,
    ).set_function(lambda: writer.dropped)
    Gauge(
        "fairlane_ledger_shedding",
        "1 while the router refuses new requests (503) because its ledger is full.",
        registry=registry,
    ).set_function(lambda: 1 if writer.shedding else 0)
    Gauge(
        "fairlane_ledger_last_write_age_seconds",
        "Seconds since rows last reached the ledger database.",
        registry=registry,
    ).set_function(lambda: writer.last_write_age_s)
    registry.register(_WriteErrors(writer))
