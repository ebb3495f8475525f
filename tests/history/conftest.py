"""Fixtures shared by the engine tests on the fake homeserver."""

from __future__ import annotations

import pytest

from gapline.matrix.testing import FakeHomeserver


@pytest.fixture
def fake() -> FakeHomeserver:
    """A fresh in-memory homeserver for the test."""
    return FakeHomeserver()


@pytest.fixture
def alice(fake: FakeHomeserver):
    """Alice's session on ``fake``."""
    return fake.register("alice")
