"""Work an operation hands to its commit: ``Tx.after_commit``.

Why a hook and not the caller's ``await``: a write's caller resumes on the
event loop one hop after the COMMIT, while the next write may already be
running on the writer thread. A store that keeps something in memory beside
the database (a cache of rows it read or wrote) must change it exactly when
the transaction holding the change commits, before any later transaction on
the same writer reads it, and never when it rolls back. So the hooks run on
the writer thread right after the COMMIT returned, in the order they were
registered, before the callers' futures resolve; a savepoint rolled back
(one operation of a group failing) drops the hooks its operation registered,
and a transaction rolled back drops them all.

A hook that raises does not undo the commit: its exception becomes the
outcome of the operation that registered it (the write happened, what was
to follow it did not), and the other hooks still run.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CommitHooks"]


class CommitHooks:
    """The hooks registered in the current transaction, truncated like its savepoints."""

    __slots__ = ("_hooks",)

    def __init__(self) -> None:
        self._hooks: list[Callable[[], None]] = []

    def add(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def mark(self) -> int:
        return len(self._hooks)

    def truncate(self, mark: int) -> None:
        del self._hooks[mark:]

    def take(self) -> list[Callable[[], None]]:
        hooks, self._hooks = self._hooks, []
        return hooks


def refuse_read_hooks(hooks: CommitHooks) -> None:
    """A read never commits: a hook registered in one would silently never run."""
    if hooks.take():
        raise TypeError("after_commit in a read: only a write commits, so the hook would never run")
