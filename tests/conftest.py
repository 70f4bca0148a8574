"""Shared fixtures. Fixture modules live beside this file and are loaded as plugins."""

pytest_plugins = ["tests.redis_server"]
