"""Multi-turn chat on simulated replicas with prefix caches: replica choice ``load`` against ``prefix``.

    python -m loadtest.sim.chat_scenario --replicas 64 --tenants 64 --rate 40 --json out/chat.json

Each tenant has a system prompt (``--system-tokens``, 2,000); conversations start at ``--rate`` per
second (Poisson), each of a random tenant, and run ``--turns`` (5) turns. Every turn resends the
whole history (system prompt, earlier user messages and answers) plus a new user message (lognormal,
median ``--user-tokens``); the answer's length is drawn likewise (``--answer-tokens``); the next turn
is sent an exponential think time (``--think-s``) after the answer ends. The same conversations run
once per choice. The router is a FIFO queue (fairness between tenants is not what this compares)
that dispatches while fewer than ``--room`` × replicas requests are in flight, as the cluster's
dispatcher; the choice then takes any replica below ``--room`` + 8 (Serve's ``max_ongoing_requests``),
so it is not forced to the one replica that just freed a slot. Reported per choice: hit
rate (cached / prompt tokens), TTFT p50/p99 (arrival to first token, queueing included), output
tokens per second, and evictions; requests arriving in the first ``--warmup-s`` are left out.
``--concurrency N`` runs a closed loop instead (saturation): N conversations at once without think
time, each replaced by the next when it ends, ``--conversations`` in all.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from loadtest.sim.events import EventLoop
from loadtest.sim.prefix_cache_sim import CachingReplica, ChatChains, PrefixChoice
from loadtest.sim.replica import Job, ReplicaSpec
from loadtest.sim.step_model import load_step_model

BLOCK = 16
KEY_BITS = 20  # a key is owner << KEY_BITS | block index (owner: a tenant's system prompt or a conversation)


@dataclass(slots=True)
class Conversation:
    tenant: int
    start_s: float
    users: list[int]
    answers: list[int]
    think_s: list[float]
    turn: int = 0
    history: int = 0  # tokens after the system prompt sent so far (users and answers)


def make_conversations(args: argparse.Namespace) -> list[Conversation]:
    rng = np.random.default_rng(args.seed)
    count = args.conversations or int(args.rate * args.duration_s)
    starts = np.cumsum(rng.exponential(1.0 / args.rate, count))
    convs = []
    for start in starts:
        users = np.maximum(4, rng.lognormal(np.log(args.user_tokens), 0.5, args.turns)).astype(int)
        answers = np.clip(rng.lognormal(np.log(args.answer_tokens), 0.5, args.turns), 1, 512).astype(int)
        think = rng.exponential(args.think_s, args.turns) if not args.concurrency else np.zeros(args.turns)
        tenant = int(rng.integers(args.tenants))
        convs.append(Conversation(tenant, float(start), users.tolist(), answers.tolist(), think.tolist()))
    return convs


def chains_for(conv_owner: int, tenant_owner: int, system: int, prompt: int, answer: int) -> ChatChains:
    """Block keys of a turn: blocks wholly inside the system prompt are the tenant's, the rest the
    conversation's (its token stream only grows: each turn's prompt starts with the previous turn's
    prompt and answer)."""

    def keys(blocks: int) -> tuple[int, ...]:
        sys_blocks = system // BLOCK
        return tuple(
            ((tenant_owner if i < sys_blocks else conv_owner) << KEY_BITS) | i for i in range(blocks)
        )

    return ChatChains(
        keys(max(0, prompt - 1) // BLOCK), keys(prompt // BLOCK), keys((prompt + answer) // BLOCK)
    )


class ChatRun:
    """One choice over the conversations: a FIFO router, replicas with caches, turns that follow answers."""

    def __init__(self, args: argparse.Namespace, mode: str, convs: list[Conversation]) -> None:
        self.args, self.loop = args, EventLoop()
        spec = ReplicaSpec(
            load_step_model(args.step_model),
            args.kv_blocks,
            BLOCK,
            args.max_num_seqs,
            args.max_num_batched_tokens,
        )
        self.replicas = [CachingReplica(i, spec, self.loop, self._finished) for i in range(args.replicas)]
        self.choice = PrefixChoice(mode)
        self.convs = [Conversation(c.tenant, c.start_s, c.users, c.answers, c.think_s) for c in convs]
        self.queue: deque[tuple[Job, ChatChains]] = deque()
        self.in_flight = 0
        self.jobs: dict[int, tuple[int, float, Job]] = {}  # rid -> (conversation, arrival, job)
        self.records: list[
            tuple[float, float, float, int, int, int]
        ] = []  # arrival, ttft, end, out, prompt, cached

    def run(self) -> dict:
        closed = self.args.concurrency
        self.next_conv = closed
        for ci, conv in enumerate(self.convs[:closed] if closed else self.convs):
            self.loop.at(0.0 if closed else conv.start_s, self._send, ci)
        self.loop.at(0.0, self._tick)  # after the first sends: a closed loop's tick sees them
        started = time.perf_counter()
        self.loop.run()
        return self._report(time.perf_counter() - started)

    def _tick(self) -> None:
        self.choice.refresh(self.replicas, self.loop.now)
        if self.jobs or self.queue or (self.loop.now < self.args.duration_s and not self.args.concurrency):
            self.loop.after(self.args.stats_period_s, self._tick)

    def _send(self, ci: int) -> None:
        conv = self.convs[ci]
        turn, system = conv.turn, self.args.system_tokens
        prompt = system + conv.history + conv.users[turn]
        answer = conv.answers[turn]
        rid = len(self.jobs) + len(self.records)
        job = Job(rid, prompt, answer)
        chains = chains_for(self.args.tenants + ci, conv.tenant, system, prompt, answer)
        self.jobs[rid] = (ci, self.loop.now, job)
        self.queue.append((job, chains))
        self._dispatch()

    def _dispatch(self) -> None:
        capacity = self.args.room * len(self.replicas)
        while self.queue and self.in_flight < capacity:
            job, chains = self.queue[0]
            replica = self.choice.choose(self.replicas, job, chains, self.args.room + 8, self.loop.now)
            if replica is None:
                return
            self.queue.popleft()
            self.in_flight += 1
            replica.submit_chat(job, chains)

    def _finished(self, job: Job, now: float) -> None:
        ci, arrival, _ = self.jobs.pop(job.rid)
        self.in_flight -= 1
        self.records.append((arrival, job.first_token - arrival, now, job.output, job.prompt, job.cached))
        conv = self.convs[ci]
        conv.history += conv.users[conv.turn] + conv.answers[conv.turn]
        conv.turn += 1
        if conv.turn < len(conv.users):
            self.loop.after(conv.think_s[conv.turn - 1], self._send, ci)
        elif self.args.concurrency and self.next_conv < len(self.convs):  # closed loop: the next one
            self.next_conv += 1
            self._send(self.next_conv - 1)
        self._dispatch()

    def _report(self, wall_s: float) -> dict:
        rec = np.array(self.records, dtype=float).reshape(-1, 6)
        kept = rec[rec[:, 0] >= self.args.warmup_s]
        span = kept[:, 2].max() - self.args.warmup_s if len(kept) else 0.0
        return {
            "choice": self.choice.mode,
            "requests": len(kept),
            "hit_rate": round(float(kept[:, 5].sum() / max(1.0, kept[:, 4].sum())), 4),
            "ttft_p50_s": round(float(np.percentile(kept[:, 1], 50)), 4),
            "ttft_p99_s": round(float(np.percentile(kept[:, 1], 99)), 4),
            "output_tok_s": round(float(kept[:, 3].sum() / span), 1) if span > 0 else 0.0,
            "evictions": sum(r.cache.evictions for r in self.replicas),
            "sim_end_s": round(float(rec[:, 2].max()), 1),
            "wall_s": round(wall_s, 1),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=64)
    p.add_argument("--tenants", type=int, default=64)
    p.add_argument("--rate", type=float, default=40.0, help="conversations started per second")
    p.add_argument("--duration-s", type=float, default=300.0, help="conversations start for this long")
    p.add_argument("--warmup-s", type=float, default=60.0)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--system-tokens", type=int, default=2000)
    p.add_argument("--user-tokens", type=float, default=60.0)
    p.add_argument("--answer-tokens", type=float, default=128.0)
    p.add_argument("--think-s", type=float, default=5.0)
    p.add_argument(
        "--room", type=int, default=32, help="the dispatcher's requests per replica (replica_room)"
    )
    p.add_argument("--step-model", default="h200-llama-3.1-8b")
    p.add_argument("--kv-blocks", type=int, default=54_067, help="per replica (8B on an H200)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--stats-period-s", type=float, default=0.5)
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="closed loop (saturation): this many conversations at once, no think time, each followed "
        "by the next at its end (--conversations in all); 0: Poisson starts at --rate",
    )
    p.add_argument("--conversations", type=int, default=0)
    p.add_argument("--choices", default="load,prefix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    convs = make_conversations(args)
    runs = [ChatRun(args, mode, convs).run() for mode in args.choices.split(",")]
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "args": vars(args),
        "runs": runs,
        "results": {run["choice"]: run for run in runs},  # the same runs, by choice
    }
    for run in runs:
        print(json.dumps(run))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
