"""One admitted request, as the engine's event-loop side sees it: where its outputs go, and when it ends.

The engine hands each step's outputs to the event loop in one batch (``Engine._deliver``); every
output then goes to its request's ``on_output``, a plain callable run right there. A caller that
streams (``Engine.generate``) passes a queue's ``put_nowait`` and reads the queue; a caller that
forwards outputs elsewhere (the replica's stream channel) passes a function that forwards each one
at once: no task wakes per request and step, which at a hundred open streams is most of a busy
replica's event-loop time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from replica.outputs import RequestOutput
from replica.sequence import Sequence

log = logging.getLogger(__name__)

OutputCallback = Callable[[RequestOutput | Exception], None]


@dataclass(eq=False)
class OpenRequest:
    """Bookkeeping between admission and the last output.

    ``on_output`` gets every output of every sample, in order, and nothing after the request ended:
    all of its samples finished, or one ``Exception`` came (the request failed). ``waiting`` is the
    request's share of the engine's ``waiting_tokens`` until its first output. ``forget`` runs once,
    when the request ends or is cancelled; ``abort`` when it is cancelled while still producing."""

    request_id: str
    seqs: tuple[Sequence, ...]
    on_output: OutputCallback
    waiting: int
    forget: Callable[[OpenRequest], None]
    abort: Callable[[OpenRequest], None]
    open_samples: int = field(init=False)

    def __post_init__(self) -> None:
        self.open_samples = len(self.seqs)

    @property
    def open(self) -> bool:
        return self.open_samples > 0

    def deliver(self, item: RequestOutput | Exception) -> None:
        """One output from the engine's step batch (called on the event loop)."""
        if not self.open:
            return
        self.waiting = 0
        self.open_samples = 0 if isinstance(item, Exception) else self.open_samples - item.finished
        if not self.open:
            self.forget(self)
        try:
            self.on_output(item)
        except Exception:  # a caller's bug must not cost the rest of the step's outputs
            log.exception("the output callback of request %s failed", self.request_id)

    def cancel(self) -> None:
        """The caller is done with the request: abort it in the engine if it is still producing."""
        if not self.open:
            return
        self.open_samples = 0
        self.forget(self)
        self.abort(self)
