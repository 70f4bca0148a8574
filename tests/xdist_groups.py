"""Pytest plugin: the work units of a pytest-xdist run (``python -m pytest -n 2 --dist loadgroup``).

Two units share a Ray + Serve each, one per worker, so the Ray work no longer runs on one worker
while the other idles (it did for the last ~380 s of a 1,415-s run, cpu_test_suite_dec06.json in
docs/bench):
* ``ray``: every module with a test that needs the cluster tests' Ray + Serve (``ray_serve``,
  ``serve_port``), in collection order, as a plain run does. The longest unit: sent
  first.
* ``ray-faults``: the fault drills (``fault_port``), sent second. Their Ray is the cluster tests' in a
  plain run; under two workers the other worker starts its own, in a private temp dir
  (``tests/cluster/helpers.private_ray_dir``: two Rays never find each other), and the faults
  package's fixtures stop it when the package ends.
A module with tests of both is in ``ray``. A module of ``own_ray`` tests (a ``fairlane`` process
starting a Ray of its own, with a private temp dir and no RAY_ADDRESS) is a unit of its own, sent
next. Every other module is a unit of its own, run whole on one worker (its module fixtures load
once) by whichever is free.

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

# Fixtures that start or join a shared Ray + Serve, and the unit whose Ray they use: a test that
# takes one, directly or through another fixture, needs that Ray.
RAY_UNIT, FAULTS_UNIT = "ray", "ray-faults"
RAY_FIXTURES = {
    "ray_serve": RAY_UNIT,
    "serve_port": RAY_UNIT,
    "fault_port": FAULTS_UNIT,
}
SHARED_RAY_UNITS = (RAY_UNIT, FAULTS_UNIT)  # sent in this order, before everything else
GROUPS_KEY = "fairlane_unit_file"
_DIR = pytest.StashKey[str]()


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def shared_ray_unit(item: pytest.Item) -> str | None:
    """The shared-Ray unit a test needs (``ray`` where it takes fixtures of both), else None."""
    wanted = {RAY_FIXTURES[f] for f in item.fixturenames if f in RAY_FIXTURES}
    return next((unit for unit in SHARED_RAY_UNITS if unit in wanted), None)


def module_units(items: list[pytest.Item]) -> dict[str, str]:
    """Each module's unit: the shared-Ray unit its tests need (``ray`` before ``ray-faults``), else
    the module itself."""
    units: dict[str, str] = {}
    for item in items:
        module, unit = _module(item), shared_ray_unit(item)
        if unit is not None and units.get(module) not in SHARED_RAY_UNITS[: SHARED_RAY_UNITS.index(unit)]:
            units[module] = unit
        else:
            units.setdefault(module, module)
    return units


def send_order(items: list[pytest.Item], units: dict[str, str]) -> list[pytest.Item]:
    """The shared-Ray units' tests first (``ray``, the critical path, then ``ray-faults``), then the
    own-Ray modules' (the next longest), then the rest; collection order within each (xdist sends
    units in first-seen order)."""
    own = {_module(item) for item in items if item.get_closest_marker("own_ray")}
    shared = len(SHARED_RAY_UNITS)

    def rank(item: pytest.Item) -> int:
        module = _module(item)
        if units[module] in SHARED_RAY_UNITS:
            return SHARED_RAY_UNITS.index(units[module])
        return shared if module in own else shared + 1

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
        order (``send_order``: the shared-Ray units first, one to each worker). A worker is given its
        next unit only when two of its tests are left, so a shared-Ray worker takes no other until
        its unit ends."""

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
