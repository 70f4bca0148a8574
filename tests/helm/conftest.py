"""Fixtures of the chart tests: one render per values variant, shared by the whole session."""

from __future__ import annotations

import pytest

from tests.helm.chart import VARIANTS, Rendered, render_variant


@pytest.fixture(params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    """The chart rendered with each variant: default values, ci/all-options, ci/external-redis."""
    return render_variant(request.param)


@pytest.fixture
def default() -> Rendered:
    return render_variant("default")


@pytest.fixture
def all_options() -> Rendered:
    return render_variant("all-options")


@pytest.fixture
def external() -> Rendered:
    return render_variant("external-redis")
