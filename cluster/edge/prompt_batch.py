"""A completions request with several prompts: one request per prompt, answered as one.

Each prompt is admitted, queued, dispatched and charged as a request of its own (its own lease,
fair-queue turn, timing record); ``BatchRequest`` reads their outputs as one stream whose choice
indexes follow OpenAI's: prompt index × choices per prompt + choice. A batch of one is the plain
``ActiveRequest``, untouched (no merging cost on the common path).

Every prompt's outputs are read as soon as it is dispatched, before the answer starts: a tenant
holds a bounded share of the dispatch room (``docs/cluster.md``, "Reserved room"), so a later
prompt may wait for an earlier one to end, and an earlier one ends only when its outputs are read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from cluster.routing.request_flow import ActiveRequest, RequestRunner
from cluster.routing.request_job import Job

_END = object()


async def open_all(runner: RequestRunner, jobs: Sequence[Job], *args: Any) -> ActiveRequest | BatchRequest:
    """Open every prompt's request (``args``: what ``RequestRunner.open`` takes after the job). If
    any is refused or fails before its first output, the others are closed and that error is
    raised: the answer is all or none (prompts already answered by then stay charged)."""
    if len(jobs) == 1:
        return await runner.open(jobs[0], *args)
    batch = BatchRequest(runner, list(jobs), args)
    await batch.start()
    return batch


class BatchRequest:
    """Several requests read as one (the interface the answer code uses of ``ActiveRequest``)."""

    def __init__(self, runner: RequestRunner, jobs: list[Job], args: tuple) -> None:
        self._runner = runner
        self._args = args
        self.jobs = jobs
        self.job = jobs[0]
        self.parts: list[ActiveRequest | None] = [None] * len(jobs)
        self.lease = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._opened = 0
        self._failure: BaseException | None = None
        self._settled = asyncio.Event()  # every part opened, or one failed
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(i, job)) for i, job in enumerate(self.jobs)]
        try:
            await self._settled.wait()
        except BaseException:
            await self.close("aborted", "client_gone")
            raise
        if self._failure is not None:
            await self.close("aborted", "batch_refused")
            raise self._failure

    async def _run(self, prompt: int, job: Job) -> None:
        try:
            part = await self._runner.open(job, *self._args)
        except Exception as exc:
            if self._failure is None:
                self._failure = exc
            self._settled.set()
            return
        self.parts[prompt] = part
        self.lease = part.lease  # the latest admission's rate-limit headers: the freshest view
        self._opened += 1
        if self._opened == len(self.jobs):
            self._settled.set()
        try:
            async for item in part.outputs():  # read at once: its slot frees when it ends
                self._queue.put_nowait((prompt, item))
            self._queue.put_nowait((prompt, _END))
        except Exception as exc:
            self._queue.put_nowait((prompt, exc))

    async def outputs(self) -> AsyncIterator[dict[str, Any]]:
        """Every part's outputs as they came, each marked with its ``prompt`` and its choice index
        moved past the earlier prompts' choices; ``done`` only on the very last."""
        per_prompt = int(self.job.sampling.get("n", 1))
        open_parts, finished = len(self.jobs), 0
        try:
            while open_parts:
                prompt, item = await self._queue.get()
                if item is _END:
                    open_parts -= 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                finished += bool(item["done"])
                yield {
                    **item,
                    "prompt": prompt,
                    "index": prompt * per_prompt + item["index"],
                    "done": item["done"] and finished == len(self.jobs),
                }
        finally:
            await self.close("aborted", "client_gone")  # no-op for the parts that ended

    async def close(self, outcome, reason: str | None = None) -> None:
        """Stop every part: a part still waiting or streaming is cancelled (its request closes as
        aborted); the others are closed with ``outcome``."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for part in self.parts:
            if part is not None:
                await part.close(outcome, reason)
