"""Read the raw step records of a running local cluster's replica (for fitting the step model).

    python -m loadtest.sim.cluster_profile --out runs/fid-cluster/steps.jsonl

The replica deployment exposes only the profiler's *summary* (``Replica.profile``); a fit needs
the raw ``StepRecord``s of the same run the load test measured. Ray lets a driver run a function
inside an actor (``ActorHandle.__ray_call__``), so this joins the running Ray (``address="auto"``),
finds the Serve replica actors of the app and reads ``engine.core.profiler.recent()`` from each.
It reads Serve's private replica internals: measurement only, never on a request path.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPLICA_PREFIX = "SERVE_REPLICA::"


def _engine_records(actor, count: int) -> list[dict]:
    """Runs inside the replica actor: the user deployment object's engine profiler records."""
    wrapper = actor._replica_impl._user_callable_wrapper
    core = wrapper.user_callable._engine.core
    for _ in range(5):  # the engine thread appends while we copy: retry a mutated deque
        try:
            return core.profiler.recent(count)
        except RuntimeError:
            continue
    return core.profiler.recent(count)


def replica_records(deployment: str = "Replica", count: int = 1 << 20) -> dict[str, list[dict]]:
    """Raw step records of every replica of ``deployment``, by actor name."""
    import ray

    ray.init(address="auto", log_to_driver=False, ignore_reinit_error=True)
    out: dict[str, list[dict]] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        if name.startswith(REPLICA_PREFIX) and f"#{deployment}#" in name:
            handle = ray.get_actor(name, namespace=entry["namespace"])
            out[name] = ray.get(handle.__ray_call__.remote(_engine_records, count), timeout=60)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSONL: one step record a line (+ replica)")
    p.add_argument("--deployment", default="Replica")
    args = p.parse_args(argv)
    by_replica = replica_records(args.deployment)
    if not by_replica:
        raise SystemExit("no Serve replica actors found: is the cluster running on this machine?")
    with args.out.open("w") as f:
        for name, records in by_replica.items():
            for r in records:
                f.write(json.dumps(r | {"replica": name}) + "\n")
    print(f"{sum(map(len, by_replica.values()))} step records from {len(by_replica)} replica(s) → {args.out}")


if __name__ == "__main__":
    main()
