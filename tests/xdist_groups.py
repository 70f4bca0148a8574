"""Pytest plugin: the work units of a pytest-xdist run (``python -m pytest -n 2 --dist loadgroup``).

Every module with a test that needs Ray (a fixture of the session's shared Ray + Serve, or an
``own_ray`` test) is in ONE unit, so one worker runs all of them in collection order with one Ray,
as a plain run does. Every other module is a unit of its own, run whole on one worker (its module
fixtures load once) by whichever worker is free. Not the default yet: the Ray unit alone is ~23 of
the suite's ~36 minutes, and on the 24 GB box, with other work beside it, Ray's memory monitor once
killed a router mid-test (BENCHMARKS.md, issue 43).

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


def needs_ray(item: pytest.Item) -> bool:
    return item.get_closest_marker("own_ray") is not None or not RAY_FIXTURES.isdisjoint(item.fixturenames)


def module_units(items: list[pytest.Item]) -> dict[str, str]:
    """Each module's unit: ``ray`` when any of its tests needs Ray, else the module itself."""
    units: dict[str, str] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if needs_ray(item):
            units[module] = RAY_UNIT
        else:
            units.setdefault(module, module)
    return units


def _unit_file(config: pytest.Config) -> Path:
    """The controller's file for the map (one per run)."""
    if _DIR not in config.stash:
        config.stash[_DIR] = tempfile.mkdtemp(prefix="fairlane-xdist-")
    return Path(config.stash[_DIR]) / "units.json"


@pytest.hookimpl(trylast=True)  # after the own_ray sort: the order the units are sent in
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    target = getattr(config, "workerinput", {}).get(GROUPS_KEY)
    if target:  # a worker: every worker collects the same items and writes the same map
        scratch = f"{target}.{os.getpid()}"
        Path(scratch).write_text(json.dumps(module_units(items)))
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
        """xdist's per-scope scheduling with this plugin's units as the scopes, sent in collection
        order (the Ray unit, holding the first test, goes first)."""

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
