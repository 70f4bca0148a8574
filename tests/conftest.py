"""Shared fixtures. Fixture modules live beside this file and are loaded as plugins."""

import pytest

# tests/xdist_groups.py: which worker runs what under `-n 2 --dist loadgroup`.
pytest_plugins = ["tests.redis_server", "tests.xdist_groups"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "own_ray: starts a Ray of its own (in a subprocess); runs first")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start a Ray of their own run first, before the session's shared Ray exists: not
    two Rays' workers on the box at once, and nothing for their subprocess to find and join."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("own_ray") else 1)  # stable otherwise
