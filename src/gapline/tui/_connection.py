"""Whether the homeserver answers: what the status line says while it does not.

The engine retries on its own while the homeserver is unreachable (its sync
loop and its send queue back off); the app only needs to say so. The client
the TUI hands the engine reports each sync's outcome here, and the app
listens.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Reachability"]


class Reachability:
    """The last sync's outcome: reachable, or unreachable with the reason."""

    def __init__(self) -> None:
        self.problem: str | None = None
        """Why the homeserver is unreachable; ``None`` while it answers."""
        self._listeners: list[Callable[[], None]] = []

    @property
    def reachable(self) -> bool:
        return self.problem is None

    def answered(self) -> None:
        self._set(None)

    def unreachable(self, problem: str) -> None:
        self._set(problem)

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` when reachability changes; returns the function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _set(self, problem: str | None) -> None:
        if problem == self.problem:
            return
        self.problem = problem
        for listener in tuple(self._listeners):
            listener()
