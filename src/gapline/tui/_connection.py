"""Whether the homeserver answers, and whether it still accepts the session.

The engine retries on its own while the homeserver is unreachable (its sync
loop and its send queue back off); the app only needs to say so. The client
the TUI hands the engine reports each sync's outcome here, and the app
listens.

A session the homeserver expired (a soft logout) is resumed, not ended: the
client waits in :meth:`Reachability.ask_password` while the app asks the user,
logs the same device in again and syncs on, so nothing the engine holds is
lost. A session that was revoked outright cannot be resumed here (a new login
would be a new device, without this one's keys): the status line says how to
log in again, and stays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["PasswordWanted", "Reachability"]


@dataclass(frozen=True, slots=True)
class PasswordWanted:
    """The session of ``user_id`` on ``device_id`` expired; the app asks for the password.

    ``problem`` is why the previous answer did not resume it (``None`` the first time).
    """

    user_id: str
    device_id: str
    problem: str | None = None
    answer: asyncio.Future[str | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future(), compare=False
    )


class Reachability:
    """The last sync's outcome: reachable, or unreachable with the reason."""

    def __init__(self) -> None:
        self.problem: str | None = None
        """Why the homeserver is unreachable; ``None`` while it answers."""
        self.signed_out: str | None = None
        """How to log in again, once the homeserver ended the session for good."""
        self.password_wanted: PasswordWanted | None = None
        """The expired session waiting for its password, if one is."""
        self._listeners: list[Callable[[], None]] = []

    @property
    def reachable(self) -> bool:
        return self.problem is None

    def answered(self) -> None:
        self._set(None)

    def unreachable(self, problem: str) -> None:
        self._set(problem)

    def ended(self, how_to_return: str) -> None:
        """The session is over (revoked, or its password was not given): say so for good."""
        self.signed_out = how_to_return
        self._notify()

    async def ask_password(self, user_id: str, device_id: str, problem: str | None) -> str | None:
        """Wait until the app answers with the password (``None``: the user declined)."""
        wanted = PasswordWanted(user_id, device_id, problem)
        self.password_wanted = wanted
        self._notify()
        try:
            return await wanted.answer
        finally:
            self.password_wanted = None
            self._notify()

    def answer_password(self, password: str | None) -> None:
        """The app's answer to the pending :class:`PasswordWanted` (ignored when none is)."""
        wanted = self.password_wanted
        if wanted is not None and not wanted.answer.done():
            wanted.answer.set_result(password)

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` when reachability changes; returns the function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _set(self, problem: str | None) -> None:
        if problem == self.problem:
            return
        self.problem = problem
        self._notify()

    def _notify(self) -> None:
        for listener in tuple(self._listeners):
            listener()
