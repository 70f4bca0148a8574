"""CUDA graphs for pure-decode, all-greedy steps, at a ladder of batch sizes.

(The same class holds the mixed-step graphs at a ladder of token counts: `mixed_graphs.py`.)

Each (IO set, batch size) pair has its own graph: a graph reads its inputs at fixed addresses, and
the two IO sets alternate between steps. All graphs share one memory pool. A captured step does the
whole device side of a decode: the carried-token gather from the other set's samples, the forward
(Triton paged attention), the greedy pick, and the write of the samples into the set's buffer.
Batches are padded to the next ladder size; padded rows read and write only the reserved block 0.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

import torch

DEFAULT_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


class DecodeGraphs:
    def __init__(self, step_fn: Callable[[int, int], None], max_batch: int, ladder=DEFAULT_LADDER) -> None:
        """step_fn(set_index, batch) runs one padded greedy decode on the device (it is what we capture)."""
        self.step_fn = step_fn
        self.sizes = sorted({b for b in ladder if b <= max_batch} | {max_batch})
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.replays = 0  # steps run by these graphs (tests and benchmarks read it)
        self.timing: dict = {"warmup_s": 0.0, "capture_s": 0.0}  # what capture cost (bench/replica_start.py)

    def capture(self, stream: torch.cuda.Stream, pool=None) -> None:
        """Capture every (set, size), largest first so smaller graphs reuse the pool's blocks. `pool`:
        one shared with other graph sets (steps run one after another on one stream)."""
        self.pool = torch.cuda.graph_pool_handle() if pool is None else pool
        started = time.perf_counter()
        warmups = []
        with torch.cuda.stream(stream):
            for size in self.sizes:
                for set_index in (0, 1):
                    self.step_fn(set_index, size)  # warm-up: compile kernels, settle allocations
                stream.synchronize()
                warmups.append(time.perf_counter())
        warmed = time.perf_counter()
        for size in reversed(self.sizes):
            for set_index in (0, 1):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    self.step_fn(set_index, size)
                self.graphs[(set_index, size)] = graph
        stream.synchronize()
        starts = [started, *warmups[:-1]]
        by_size = {size: end - begin for size, begin, end in zip(self.sizes, starts, warmups, strict=True)}
        captured = time.perf_counter() - warmed
        self.timing = {"warmup_s": warmed - started, "capture_s": captured, "warmup_by_size": by_size}

    def padded_size(self, batch: int) -> int | None:
        at = bisect.bisect_left(self.sizes, batch)
        return self.sizes[at] if at < len(self.sizes) else None

    def replay(self, set_index: int, size: int) -> None:
        self.graphs[(set_index, size)].replay()
        self.replays += 1
