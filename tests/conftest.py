"""Shared fixtures. Fixture modules live beside this file and are loaded as plugins."""

pytest_plugins = ["tests.redis_server"]


def pytest_collection_modifyitems(items):
    """Tests that start a Ray instance of their own run first, before the shared one exists."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("own_ray") else 1)  # stable otherwise
