"""Fixtures of the history tests that several modules share."""

from tests.history.e2ee_support import peers

__all__ = ["peers"]
