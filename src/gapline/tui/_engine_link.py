"""How the app and an engine meet: the handle it is given, and the sink it publishes into.

Published events reach the app as messages, so they are applied on the
Textual loop in publish order; the room directory's changes come the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from textual.app import App
from textual.message import Message

from gapline.history import Answer, Command, EventSink
from gapline.history import Event as EngineEventValue

__all__ = ["AppSink", "Connect", "EngineEvent", "EngineHandle", "RoomsChanged", "command_room"]


class EngineHandle(Protocol):
    """What the app needs of an engine: run a command, get its answer."""

    async def execute(self, command: Command) -> Answer: ...


Connect = Callable[[EventSink], AbstractAsyncContextManager[EngineHandle]]
"""Opens an engine that publishes into the given sink; closing it closes the engine."""


class EngineEvent(Message):
    """One published engine event, delivered on the app's message queue."""

    def __init__(self, event: EngineEventValue) -> None:
        super().__init__()
        self.event = event


class RoomsChanged(Message):
    """The room directory changed (a sync renamed a room, brought unread counts, ...)."""


class AppSink:
    """The app's EventSink: hands each event to the app's message queue, in order."""

    def __init__(self, app: App[int]) -> None:
        self._app = app

    async def publish(self, event: EngineEventValue) -> None:
        self._app.post_message(EngineEvent(event))


def command_room(command: Command) -> str | None:
    return getattr(command, "room_id", None)
