"""Fixtures of the sandbox tests: a mission over a real git repository, and bubblewrap."""

from __future__ import annotations

import pytest

from fusion_site.runtime import sandbox
from tests.validation.conftest import build_mission  # noqa: F401 — a mission over a real git repository


@pytest.fixture
def bubblewrap():
    """These tests say nothing without bubblewrap and its overlay layer: a clear failure, never a skip."""
    if not sandbox.layers_work():
        pytest.fail(f"this suite needs bubblewrap with its overlay layer here: {sandbox.status().record}")
