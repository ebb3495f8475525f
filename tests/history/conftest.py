"""Fixtures the history tests share: the fake homeserver and its first user, and the
encrypted peers (``peers``)."""

from __future__ import annotations

import pytest

from gapline.matrix.testing import FakeHomeserver
from tests.history.e2ee_support import peers

__all__ = ["alice", "fake", "peers"]


@pytest.fixture
def fake() -> FakeHomeserver:
    """A fresh in-memory homeserver for the test."""
    return FakeHomeserver()


@pytest.fixture
def alice(fake: FakeHomeserver):
    """Alice's session on ``fake``."""
    return fake.register("alice")
