"""Shared fixtures: the real servers every part is tested against.

The fixtures live in tests/fixtures/ as plugins so each stays small:
``postgres`` starts a throwaway PostgreSQL cluster from the local binaries,
``synapse`` a throwaway Synapse homeserver. Under ``CI=true`` a server that
cannot start is a failure, never a skip.
"""

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.synapse",
]
