"""Replica choice on the CPU cluster: do a conversation's later turns reach the replica holding its prefix?

    python -m bench.prefix_routing --json docs/bench/prefix_routing_cpu.json

Two replicas of the embedded default (SmolLM2 on the CPU), once with ``replica_choice: load`` and
once with ``prefix`` (one app after the other, on one local Ray). ``--conversations`` conversations
(each its own ``cache_salt``, so its blocks exist only where its own turns went) of ``--turns`` turns
run in rounds: every conversation sends its next turn at once (the whole history: a system prompt of
~300 tokens, earlier questions and answers, a new question), in an order shuffled per round. The
report per choice: the hit rate of later turns (cached tokens / prompt tokens, turns 2 on), how many
later turns found nothing cached, and TTFT p50 of later turns (non-streamed: the whole answer).

On GPUs (not run yet): ``--replicas 2 --room 32 --conversations 64 --turns 5 --model-name llama-3.1-8b
--engine-json '{"device": "cuda", "model": "llama-3.1-8b", "random_weights": true,
"synthetic_tokenizer": true}'`` on two H200s.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

SYSTEM = (
    "You are the assistant of the harbour town's ferry office. Answer in one short sentence. Ferries "
    "leave for the islands at seven, ten, one and four o'clock from the north pier; on Sundays only "
    "the ten and four o'clock ferries run. Tickets are sold at the office until ten minutes before each "
    "departure, and online until the evening before. Bicycles travel free, cars need a reservation, and "
    "dogs must stay on a lead on the open deck. The office keeps lost property for a month; ask at the "
    "counter by the waiting room, which opens at half past six. In storms the office posts changes on "
    "the board outside and on its page an hour before the ferry would leave. "
)
QUESTIONS = (
    "When does the first ferry leave?",
    "Can I bring my bicycle?",
    "What about my dog?",
    "Where is lost property kept?",
    "What happens in a storm?",
)


def ask(client: httpx.Client, base: str, key: str, model: str, messages: list[dict], salt: str) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, "cache_salt": salt}
    started = time.monotonic()
    resp = client.post(f"{base}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    resp.raise_for_status()
    data = resp.json()
    usage = data["usage"]
    return {
        "id": data["id"],
        "latency_s": time.monotonic() - started,
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        "answer": data["choices"][0]["message"]["content"],
    }


def run_conversations(
    base: str, keys: list[str], model: str, conversations: int, turns: int, seed: int = 0, tag: str = ""
) -> list[dict]:
    """Every conversation's turns, round by round (each round's requests at once, shuffled)."""
    rng = random.Random(seed)
    histories = [[{"role": "system", "content": f"{SYSTEM}(Desk {c}.)"}] for c in range(conversations)]
    rows: list[dict] = []
    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(conversations) as pool:
        for turn in range(turns):
            order = list(range(conversations))
            rng.shuffle(order)

            def one(c: int, turn: int = turn) -> dict:
                messages = [*histories[c], {"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]}]
                out = ask(client, base, keys[c % len(keys)], model, messages, f"{tag}conv-{c}")
                histories[c] = [*messages, {"role": "assistant", "content": out["answer"]}]
                return {"conversation": c, "turn": turn, **out}

            futures = []
            for c in order:  # submitted in the shuffled order, a few ms apart, as clients would
                futures.append(pool.submit(one, c))
                time.sleep(0.005)
            rows += [f.result() for f in futures]
    return rows


def summarize(rows: list[dict]) -> dict:
    later = [r for r in rows if r["turn"] > 0]
    latencies = sorted(r["latency_s"] for r in later)
    return {
        "later_turns": len(later),
        "later_hit_rate": round(
            sum(r["cached_tokens"] for r in later) / sum(r["prompt_tokens"] for r in later), 4
        ),
        "later_turns_without_hit": sum(1 for r in later if r["cached_tokens"] == 0),
        "later_latency_p50_s": round(latencies[len(latencies) // 2], 3),
        "first_turn_hit_rate": round(
            sum(r["cached_tokens"] for r in rows if r["turn"] == 0)
            / sum(r["prompt_tokens"] for r in rows if r["turn"] == 0),
            4,
        ),
    }


def app_config(choice: str, replicas: int = 2, room: int = 4, engine: dict | None = None) -> dict:
    """The app of one run: the embedded default on the CPU unless ``engine`` says otherwise."""
    return {
        "engine": engine or {"device": "cpu", "kv_cache_tokens": 16384, "max_num_seqs": 16},
        "num_replicas": replicas,
        "replica_room": room,
        "replica_choice": choice,
        "queue_timeout_s": 600.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--room", type=int, default=4, help="replica_room")
    p.add_argument(
        "--engine-json",
        default=None,
        help='engine settings (AppConfig.engine) as JSON, e.g. {"device": "cuda", "model": "llama-3.1-8b", '
        '"random_weights": true, "synthetic_tokenizer": true}; default: SmolLM2 on the CPU',
    )
    p.add_argument(
        "--model-name", default="smollm2-135m", help="served_model_name (the engine's preset name)"
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import ray
    from ray import serve

    from cluster.app import build_app
    from cluster.ops.local_cluster import free_port
    from tenancy import DEMO_KEYS

    # The commit the replicas and routers load their code from: read before they start.
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    port = free_port()
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    results = {}
    try:
        for choice in ("load", "prefix"):
            name = f"choice-{choice}"
            engine = json.loads(args.engine_json) if args.engine_json else None
            config = app_config(choice, args.replicas, args.room, engine) | {
                "served_model_name": args.model_name
            }
            serve.run(build_app(config), name=name, route_prefix=f"/{choice}", blocking=False)
            while serve.status().applications[name].status != "RUNNING":
                time.sleep(0.5)
            base = f"http://127.0.0.1:{port}/{choice}"
            keys = [DEMO_KEYS["alice"], DEMO_KEYS["bob"]]
            rows = run_conversations(base, keys, args.model_name, args.conversations, args.turns, args.seed)
            results[choice] = summarize(rows)
            print(choice, json.dumps(results[choice]))
            serve.delete(name)
    finally:
        serve.shutdown()
        ray.shutdown()
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, 2 cores (shared)",
        "commit": commit,
        "command": "python -m bench.prefix_routing "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "json"),
        "args": vars(args),
        "results": results,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
