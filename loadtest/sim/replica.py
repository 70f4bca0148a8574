"""A simulated replica: continuous batching with the engine's admission rules, timed by a step model.

Admission mirrors ``replica/scheduler.py``: waiting requests join in arrival order while the sequence
cap (``max_num_seqs``) and free KV blocks allow (head-of-line: the first that does not fit stops
the rest); prompts are prefilled in chunks of the step's token budget (``max_num_batched_tokens``
minus the running decodes) while the running sequences keep decoding. Differences (docs/simulator.md):
KV blocks for prompt + output are reserved at join (the engine allocates as it goes and preempts);
a whole admission round is one prefill *phase*; stops are not a step late.

Between changes of the running set, step ``s`` lasts ``a + b·B + d·(K + B·s)`` ms (Σcontext grows
by ``B`` per step), so the time of the next completion is a closed-form sum: the simulator does
not visit every step, only joins and completions.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from loadtest.sim.events import EventLoop
from loadtest.sim.step_model import StepModel


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """The engine sizes a simulated replica obeys."""

    step: StepModel
    kv_blocks: int
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    # The async engine builds step N+1 while N runs, so a request that reaches a busy engine during
    # step N joins at N+2 (measured on the CPU cluster: 30 of 36 such requests); 0 = the next step.
    join_lag_steps: int = 0

    @classmethod
    def of_cluster(cls, step: StepModel, cluster) -> ReplicaSpec:
        """The sizes a scenario's cluster section gives (``loadtest/sim/spec.py`` ``ClusterSpec``)."""
        return cls(
            step,
            cluster.kv_blocks,
            cluster.block_size,
            cluster.max_num_seqs,
            cluster.max_num_batched_tokens,
            cluster.join_lag_steps,
        )


@dataclass(slots=True)
class Job:
    """One request on a replica; ``output`` is the number of tokens it will produce (>= 1)."""

    rid: int
    prompt: int
    output: int
    cached: int = 0  # prompt tokens found in the prefix cache: not prefilled (prefix_cache_sim.py)
    blocks: int = 0
    finish_step: int = 0
    kc_term: int = 0
    first_token: float = math.nan
    replica: int = -1


@dataclass(slots=True)
class _Phase:
    jobs: list[Job]
    end_step: int


@dataclass(slots=True)
class SimReplica:
    """State of one replica; ``on_finish(job, now)`` is called after each request's last token."""

    index: int
    spec: ReplicaSpec
    loop: EventLoop
    on_finish: Callable[[Job, float], None]
    free_blocks: int = 0
    batch: int = 0
    kc: int = 0  # Σcontext at step s is kc + batch·s
    s0: int = 0  # the step the current decode stretch started at
    t0: float = 0.0  # ... and its time (seconds)
    version: int = 0  # invalidates scheduled events when the running set changes
    phase: _Phase | None = None
    join_at_step: int = -1
    running: list[tuple[int, int, Job]] = field(default_factory=list)
    pending: deque[Job] = field(default_factory=deque)
    busy_s: float = 0.0
    ongoing: int = 0  # requests on this replica (waiting, prefilling or decoding)

    def __post_init__(self) -> None:
        self.free_blocks = self.spec.kv_blocks

    @property
    def waiting_tokens(self) -> int:
        return sum(j.prompt for j in self.pending)

    def blocks_for(self, prompt: int, output: int) -> int:
        return -(-(prompt + output) // self.spec.block_size)

    def submit(self, job: Job) -> None:
        """A request arrives from the router; it joins at the next step boundary it fits."""
        job.blocks = self.blocks_for(job.prompt, job.output)
        job.replica = self.index
        if job.blocks > self.spec.kv_blocks:
            raise ValueError(
                f"request {job.rid} needs {job.blocks} KV blocks, the replica has {self.spec.kv_blocks}"
            )
        self.pending.append(job)
        self.ongoing += 1
        if self.phase is not None or not self._can_admit():
            return
        now = self.loop.now
        if self.batch == 0 or now <= self.t0:
            self._advance(now)
            self._start_phase()
            return
        n = self._steps_until(now - self.t0) + self.spec.join_lag_steps
        boundary = self.s0 + n
        if boundary < self.running[0][0] and boundary != self.join_at_step:
            self.join_at_step = boundary
            self.version += 1
            self.loop.at(self.t0 + self._elapsed(n), self._on_boundary, self.version, boundary)

    # -- time arithmetic -------------------------------------------------------------------------

    def _elapsed(self, n: int) -> float:
        """Seconds for ``n`` decode steps from ``s0`` with the current batch."""
        m, b = self.spec.step, self.batch
        per = m.a + m.b * b + m.d * (self.kc + b * self.s0)
        return (n * per + m.d * b * n * (n - 1) / 2) / 1000.0

    def _steps_until(self, dt: float) -> int:
        """Smallest n >= 1 whose n steps end at or after ``dt`` seconds into the stretch."""
        m, b = self.spec.step, self.batch
        alpha = m.d * b / 2
        beta = m.a + m.b * b + m.d * (self.kc + b * self.s0) - alpha
        target = dt * 1000.0
        n = (
            target / beta
            if alpha == 0
            else (-beta + math.sqrt(beta * beta + 4 * alpha * target)) / (2 * alpha)
        )
        n = max(1, math.ceil(n - 1e-9))
        while self._elapsed(n) < dt:
            n += 1
        while n > 1 and self._elapsed(n - 1) >= dt:
            n -= 1
        return n

    def _advance(self, now: float) -> None:
        """Account the decode stretch up to ``now`` (a step boundary) and start a new stretch there."""
        if self.batch:
            self.busy_s += now - self.t0
        self.t0 = now

    # -- events ----------------------------------------------------------------------------------

    def _on_boundary(self, version: int, step: int) -> None:
        if version != self.version:
            return
        self.join_at_step = -1
        self._advance(self.loop.now)
        self.s0 = step
        done = self._pop_finished(step)
        if self._can_admit():
            self._start_phase()
        else:
            self._schedule_completion()
        self._report(done)

    def _start_phase(self) -> None:
        jobs = []
        while self.pending and self._can_admit():
            job = self.pending.popleft()
            self.free_blocks -= job.blocks
            jobs.append(job)
        m, b_old = self.spec.step, self.batch
        prompt = sum(j.prompt - j.cached for j in jobs)
        budget = max(1, self.spec.max_num_batched_tokens - b_old)
        k = max(1, -(-prompt // budget))
        ctx = k * (self.kc + b_old * self.s0) + b_old * k * (k - 1) // 2
        ms = k * (m.a + m.b * (b_old + len(jobs))) + m.c * prompt + m.d * ctx
        self.phase = _Phase(jobs, self.s0 + k)
        self.version += 1
        self.loop.after(ms / 1000.0, self._on_phase_end, self.version)

    def _on_phase_end(self, version: int) -> None:
        if version != self.version or self.phase is None:
            return
        now, phase = self.loop.now, self.phase
        self.phase = None
        self.busy_s += now - self.t0
        self.t0, self.s0 = now, phase.end_step
        for job in phase.jobs:
            job.first_token = now
            job.finish_step = phase.end_step + job.output - 1
            job.kc_term = job.prompt + 1 - phase.end_step
            self.kc += job.kc_term
            self.batch += 1
            heapq.heappush(self.running, (job.finish_step, job.rid, job))
        done = self._pop_finished(phase.end_step)
        if self._can_admit():
            self._start_phase()
        else:
            self._schedule_completion()
        self._report(done)

    def _schedule_completion(self) -> None:
        self.version += 1
        if self.running:
            step = self.running[0][0]
            self.loop.at(self.t0 + self._elapsed(step - self.s0), self._on_boundary, self.version, step)

    def _pop_finished(self, step: int) -> list[Job]:
        done = []
        while self.running and self.running[0][0] <= step:
            job = heapq.heappop(self.running)[2]
            self.batch -= 1
            self.kc -= job.kc_term
            self.free_blocks += job.blocks
            self.ongoing -= 1
            done.append(job)
        return done

    def _report(self, done: list[Job]) -> None:
        now = self.loop.now
        for job in done:
            self.on_finish(job, now)

    def _can_admit(self) -> bool:
        if not self.pending:
            return False
        in_batch = self.batch + (len(self.phase.jobs) if self.phase else 0)
        return in_batch < self.spec.max_num_seqs and self.pending[0].blocks <= self.free_blocks
