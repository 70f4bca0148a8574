"""The engine alone under a closed-loop scenario: the baseline of the Serve-path overhead.

    python -m bench.engine_alone --config APP.yaml --scenario SCENARIO.json --out DIR

Builds the replica's engine in this process from the app config (same model, sizes, tokenizer)
and sends the scenario's closed-loop requests straight to ``Engine.generate``: the same prompts,
lengths and per-worker seeds as the load generator would send through HTTP, the router and the
Serve handle (``loadtest.runner``). Each request becomes a ``RequestRecord`` timed as the client
times one (first output = first token; each output with text = a content chunk), and the folder
is written by ``loadtest.run_dir``, so both sides share every metric definition. Run it before the
cluster starts (or after it stops): it takes the device's memory the way a replica does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from cluster.app import engine_kwargs
from cluster.config import AppConfig, load_app_config
from cluster.text.word_tokenizer import attach_to_engine, word_tokenizer
from loadtest.client import monotonic_since
from loadtest.plan import ClosedLoopSource, PlannedRequest
from loadtest.records import RequestRecord
from loadtest.run_dir import write_run
from loadtest.runner import RunResult
from loadtest.sampling_mix import engine_fields
from loadtest.scenario import Scenario, TenantLoad
from replica import Engine, EngineConfig, SamplingParams


class EngineAloneRun:
    """Closed-loop workers against one in-process engine, bounded by the scenario's deadline."""

    def __init__(self, engine: Engine, scenario: Scenario) -> None:
        self.engine = engine
        self.s = scenario
        self.records: list[RequestRecord] = []
        self._clock = monotonic_since(time.monotonic())

    async def run(self) -> RunResult:
        started = time.time()
        self._clock = monotonic_since(time.monotonic())
        workers = [
            asyncio.create_task(
                self._worker(load, ClosedLoopSource(load, self.s.seed + w, self.s.sampling_of(load)))
            )
            for load in self.s.tenants
            if load.concurrency
            for w in range(load.concurrency)
        ]
        try:
            async with asyncio.timeout(self.s.duration_s + self.s.drain_timeout_s):
                await asyncio.gather(*workers)
        except TimeoutError:
            pass  # the deadline: what is still running is cancelled below and recorded as such
        finally:
            for t in workers:
                t.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        elapsed = self._clock()
        records = sorted(self.records, key=lambda r: (r.scheduled, r.tenant))
        return RunResult(records, started, elapsed, elapsed, [(0.0, 1)])

    async def _worker(self, load: TenantLoad, source: ClosedLoopSource) -> None:
        while self._clock() < self.s.duration_s:
            await self._one(load, source.next())

    async def _one(self, load: TenantLoad, planned: PlannedRequest) -> None:
        now = self._clock()
        record = RequestRecord(
            request_id=f"{load.id}-{len(self.records)}",
            tenant=load.id,
            sla_class=load.sla_class,
            weight=load.weight,
            scheduled=now,
            sent=now,
            max_tokens=planned.max_tokens,
            warmup=now < self.s.warmup_s,
        )
        self.records.append(record)
        params = SamplingParams(max_tokens=planned.max_tokens, **engine_fields(planned.sampling))
        record.choices = params.n
        answers: dict[int, int] = {}  # output tokens per answer (n > 1 answers interleave)
        try:
            async for out in self.engine.generate(self._prompt_ids(planned.prompt), params):
                t = self._clock()
                record.first_token = record.first_token if record.first_token is not None else t
                if out.text and out.index == 0:
                    record.token_times.append(t)
                answers[out.index] = out.num_output_tokens
                record.prompt_tokens, record.output_tokens = out.num_prompt_tokens, sum(answers.values())
            record.status = "ok"
        except asyncio.CancelledError:
            record.status, record.error = "cancelled", "run_deadline"
            raise
        except Exception as exc:  # an engine error ends this request only, as the router would
            record.status, record.error = "stream_error", type(exc).__name__
        finally:
            record.end = self._clock()

    def _prompt_ids(self, prompt: str) -> list[int]:
        # As the router encodes (cluster.text.prompts): raw text for completions, the template for chat.
        if self.s.endpoint == "chat":
            return self.engine.apply_chat_template([{"role": "user", "content": prompt}])
        return self.engine.tokenizer.encode(prompt, add_special_tokens=False)


async def run_engine_alone(app: AppConfig, scenario: Scenario) -> RunResult:
    if any(t.rate is not None for t in scenario.tenants):
        raise ValueError("the engine-alone run takes closed-loop tenants (concurrency) only")
    engine = Engine(EngineConfig(**engine_kwargs(app.engine)))
    await engine.start()
    try:
        if app.engine.synthetic_tokenizer:
            attach_to_engine(engine, word_tokenizer(engine.loaded.config.vocab_size))
        if engine.tokenizer is None:
            raise ValueError("the engine has no tokenizer: set engine.synthetic_tokenizer for random weights")
        return await EngineAloneRun(engine, scenario).run()
    finally:
        await engine.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="App config YAML (its engine section is used).")
    p.add_argument("--scenario", type=Path, required=True, help="Scenario as JSON (closed-loop tenants).")
    p.add_argument("--out", type=Path, required=True, help="Run folder: records.jsonl, summary.json.")
    args = p.parse_args(argv)
    app = load_app_config(args.config)
    scenario = Scenario.model_validate_json(args.scenario.read_text(encoding="utf-8"))
    result = asyncio.run(run_engine_alone(app, scenario))
    summary = write_run(args.out, scenario, "engine://in-process", result)
    o = summary["overall"]
    line = {
        "output_tps": o["output_throughput_tps"],
        "ok": o["ok"],
        "ttft_p50_s": o["ttft_s"]["p50"],
        "tpot_p50_s": o["tpot_s"]["p50"],
    }
    print("engine alone:", json.dumps(line))


if __name__ == "__main__":
    main()
