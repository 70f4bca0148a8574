"""Shared fixtures. Fixture modules live beside this file and are loaded as plugins."""

import ctypes
import gc
from collections.abc import Iterator

import pytest

# tests/xdist_groups.py: which worker runs what under `-n 2 --dist loadgroup`.
pytest_plugins = ["tests.redis_server", "tests.xdist_groups"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "own_ray: starts a Ray of its own (in a subprocess); runs first")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In one process, tests that start a Ray of their own run first, before the session's shared Ray
    exists: not two Rays' workers on the box at once. (Under the README's two workers the order units
    are sent in is tests/xdist_groups.py's, which puts them beside the shared Ray instead.)"""
    items.sort(key=lambda item: 0 if item.get_closest_marker("own_ray") else 1)  # stable otherwise


# glibc's malloc_trim, from the symbols this process already has; None elsewhere (macOS, musl).
_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)


@pytest.fixture(scope="module", autouse=True)
def return_freed_memory() -> Iterator[None]:
    """After each module (its fixtures torn down first: set up first, torn down last), give back what
    its engines freed. glibc keeps it otherwise: once a large block is freed, its mmap threshold rises
    and later allocations come from heaps it never shrinks. One test process had grown to 10 GB by the
    end of tests/replica with no engine alive (4.4 GB after three modules, 0.5 GB trimmed), beside the
    shared Ray on the 24 GB box: 22.8 GB used at the peak of a two-worker run, near Ray's memory
    monitor's 95%."""
    yield
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
