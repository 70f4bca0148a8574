"""Backpressure: a router whose ledger cannot take another row refuses new requests (503) instead
of serving them and dropping their rows (issue 43: a billing record is never dropped while the
router keeps serving).

The spill file absorbs a slow or absent database (``writer.py``); only its bound, a failing disk or
a stuck thread can fill the ledger. The writer sheds at ``WriterSettings.shed_at`` of either bound,
so the requests already admitted still find room for their rows. A shed request has no ledger row
(like a 401): it was never served, and a row would only grow the backlog it is refused for.
"""

from __future__ import annotations

from cluster.errors import ServiceUnavailable

RETRY_AFTER_S = 5


class LedgerFull(ServiceUnavailable):
    """The ledger is full on this router: retry later or on another router (503, Retry-After)."""

    def __init__(self) -> None:
        super().__init__(
            "the request ledger cannot record more requests now; retry later",
            code="ledger_full",
            headers={"retry-after": str(RETRY_AFTER_S)},
        )
