"""Shared fixtures. Fixture modules live beside this file and are loaded as plugins."""

import ctypes
import ctypes.util
import gc
from collections.abc import Iterator

import pytest

# tests/xdist_groups.py: which worker runs what under `-n 2 --dist loadgroup`.
pytest_plugins = ["tests.redis_server", "tests.xdist_groups"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "own_ray: starts a Ray of its own (in a subprocess); runs first")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start a Ray of their own run first, before the session's shared Ray exists: not
    two Rays' workers on the box at once, and nothing for their subprocess to find and join."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("own_ray") else 1)  # stable otherwise


def _libc_malloc_trim() -> None:
    """Hand the heap's free pages back to the system (glibc only; elsewhere nothing)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


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
    _libc_malloc_trim()
