"""Shared fixtures: the real servers every part is tested against.

The fixtures live in tests/fixtures/ as plugins so each stays small:
``postgres`` starts a throwaway PostgreSQL cluster from the local binaries,
``synapse`` a throwaway Synapse homeserver. Under ``CI=true`` a server that
cannot start is a failure, never a skip.
"""

import logging
from collections.abc import Iterator

import pytest

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.synapse",
]


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """A command run in-process (``main(["bot", ...])``, ``relay serve``) installs its
    JSON handler on the root or the 'gapline' logger and stops propagation; undo it
    after each test, so a later test's log capture sees every record."""
    loggers = [logging.getLogger(), logging.getLogger("gapline")]
    saved = [(list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for logger, (handlers, level, propagate) in zip(loggers, saved, strict=True):
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
