"""Pytest plugin: the work units of a pytest-xdist run (``python -m pytest -n 2 --dist loadgroup``).

Every module with a test that needs the session's shared Ray + Serve is in ONE unit, so one worker
runs all of them in collection order with one Ray, as a plain run does. It is the run's longest unit
(about 1,400 of the suite's 2,400 test-seconds under two workers, cpu_test_suite_dec06.json in
docs/bench), so it is sent first and the other worker takes everything else meanwhile. A module of
``own_ray`` tests (a ``fairlane`` process starting a Ray of its own, with a private temp dir and no
RAY_ADDRESS: nothing to find or join) is a unit of its own, sent next: the other worker runs it
beside the shared Ray, as the bench smoke runs' subprocess Rays already do (a plain run keeps them
first, one Ray at a time). Every other module is a unit of its own, run whole on one worker (its
module fixtures load once) by whichever is free.

The controller does not collect, so it cannot see fixtures: each worker writes the module -> unit
map it computed to a file the controller named, and the controller's scheduler reads it once the
workers have collected. (xdist's own ``--dist loadgroup`` writes the group into ``item._nodeid``,
which pytest 9.2 no longer reads, so its groups are silently ignored.)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Fixtures that start or join the session's Ray + Serve (tests/cluster, tests/faults, tests/loadtest,
# tests/ledger/test_routers.py): a test that takes one, directly or through another fixture, needs Ray.
RAY_FIXTURES = frozenset({"ray_serve", "fault_port", "cluster_url", "serve_port"})
RAY_UNIT = "ray"
GROUPS_KEY = "fairlane_unit_file"
_DIR = pytest.StashKey[str]()


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def needs_shared_ray(item: pytest.Item) -> bool:
    return not RAY_FIXTURES.isdisjoint(item.fixturenames)


def module_units(items: list[pytest.Item]) -> dict[str, str]:
    """Each module's unit: ``ray`` when any of its tests needs the shared Ray, else the module."""
    units: dict[str, str] = {}
    for item in items:
        module = _module(item)
        if needs_shared_ray(item):
            units[module] = RAY_UNIT
        else:
            units.setdefault(module, module)
    return units


def send_order(items: list[pytest.Item], units: dict[str, str]) -> list[pytest.Item]:
    """The shared-Ray unit's tests first (the critical path), then the own-Ray modules' (the next
    longest), then the rest; collection order within each (xdist sends units in first-seen order)."""
    own = {_module(item) for item in items if item.get_closest_marker("own_ray")}

    def rank(item: pytest.Item) -> int:
        module = _module(item)
        return 0 if units[module] == RAY_UNIT else 1 if module in own else 2

    return sorted(items, key=rank)  # stable


def _unit_file(config: pytest.Config) -> Path:
    """The controller's file for the map (one per run)."""
    if _DIR not in config.stash:
        config.stash[_DIR] = tempfile.mkdtemp(prefix="fairlane-xdist-")
    return Path(config.stash[_DIR]) / "units.json"


@pytest.hookimpl(trylast=True)  # after the own_ray sort: the order the units are sent in
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    target = getattr(config, "workerinput", {}).get(GROUPS_KEY)
    if target:  # a worker: every worker collects the same items and writes the same map
        units = module_units(items)
        items[:] = send_order(items, units)
        scratch = f"{target}.{os.getpid()}"
        Path(scratch).write_text(json.dumps(units))
        os.replace(scratch, target)  # whole, never half-written


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    node.workerinput[GROUPS_KEY] = str(_unit_file(node.config))


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own choice of scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None  # another --dist asked for: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnitScheduling(LoadScopeScheduling):
        """xdist's per-scope scheduling with this plugin's units as the scopes, sent in the workers'
        order (``send_order``: the shared-Ray unit first). A worker is given its next unit only when
        two of its tests are left, so the shared-Ray worker takes no other until its unit ends."""

        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                path = _unit_file(config)
                if not path.is_file():
                    raise RuntimeError(f"tests/xdist_groups.py: no worker wrote {path}")
                self.units = json.loads(path.read_text())
            module = nodeid.split("::", 1)[0]
            return self.units.get(module, module)

    config.option.loadscopereorder = False
    return ModuleUnitScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _DIR in config.stash:
        shutil.rmtree(config.stash[_DIR], ignore_errors=True)
