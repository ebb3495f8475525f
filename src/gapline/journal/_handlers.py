"""What a bot runs for each message: the handler protocol and the built-in ``echo``.

A handler is an async generator function taking the conversation (a bounded,
read-only view of the projected room or thread) and the message that
triggered it. It yields :class:`Progress` as often as it likes and ends by
yielding exactly one :class:`Final`::

    async def shout(conversation: Conversation, message: TriggerMessage) -> HandlerStream:
        yield Progress("thinking…")
        rows = await conversation.read(limit=10)
        yield Final(message.body.upper() + f" ({len(rows)} messages seen)")

Why a generator rather than ``return``: Python's async generators cannot
return a value, and a generator lets the runtime decide what to do with each
progress step (stream it as an edit) without the handler knowing about Matrix.
Progress is transport-only: it is shown while the turn runs and
never reaches the journal's projection. Only the final text is durable.

Handlers are looked up by name: a built-in name (``echo``) or
``package.module:function`` for your own, found on the import path or, failing
that, in the current directory (``myhandlers.py`` beside where ``gapline bot``
runs), as ``python script.py`` would find a module beside the script.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from gapline.journal._types import ConversationRow, Cursor

__all__ = [
    "BUILTIN_HANDLERS",
    "Conversation",
    "Final",
    "Handler",
    "HandlerError",
    "HandlerStream",
    "Progress",
    "TriggerMessage",
    "echo",
    "resolve_handler",
]


@dataclass(frozen=True, slots=True)
class TriggerMessage:
    """The message a handler answers (already durable in the journal)."""

    room_id: str
    event_id: str
    sender: str
    body: str
    thread_id: str | None
    origin_server_ts: int


class Conversation(Protocol):
    """The read side a handler gets: the conversation the message belongs to
    (its thread, or the room's main timeline), in bounded pages, oldest first.

    ``strict=True`` waits for the point refetch of any message whose visible
    revision was redacted instead of leaving it out, and raises
    `StaleConversation` when that repair fails.
    """

    async def read(
        self, *, limit: int, before: Cursor | None = None, strict: bool = False
    ) -> Sequence[ConversationRow]: ...


@dataclass(frozen=True, slots=True)
class Progress:
    """An intermediate, transport-only rendering of the answer."""

    text: str


@dataclass(frozen=True, slots=True)
class Final:
    """The answer. The last thing a handler yields."""

    text: str


HandlerStream: TypeAlias = AsyncIterator[Progress | Final]
Handler: TypeAlias = Callable[[Conversation, TriggerMessage], HandlerStream]


class HandlerError(Exception):
    """A handler name that cannot be resolved, or a handler that broke its protocol."""


async def echo(conversation: Conversation, message: TriggerMessage) -> HandlerStream:
    """Answer ``echo: <body>``, streamed as two progress steps before the final text.

    The progress steps are prefixes of the answer, as a model streaming tokens
    would produce; they exist so the streaming contract is exercised.
    """
    del conversation  # echo needs no context
    answer = f"echo: {message.body}"
    half = max(len("echo: "), len(answer) // 2)
    yield Progress("echo: …")
    yield Progress(answer[:half] + "…")
    yield Final(answer)


BUILTIN_HANDLERS: dict[str, Handler] = {"echo": echo}


def resolve_handler(name: str) -> Handler:
    """A built-in handler by name, or ``module:function`` imported from the import path or
    the current directory."""
    if name in BUILTIN_HANDLERS:
        return BUILTIN_HANDLERS[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(sorted(BUILTIN_HANDLERS))
        raise HandlerError(f"unknown handler {name!r}: use one of {known} or module:function")
    try:
        module = _import_here(module_name)
    except ImportError as exc:
        raise HandlerError(f"cannot import handler module {module_name!r}: {exc}") from exc
    handler = getattr(module, attr, None)
    if handler is None or not callable(handler):
        raise HandlerError(f"{module_name!r} has no callable {attr!r}")
    return handler


def _import_here(module_name: str) -> object:
    """Import ``module_name``; when its top package is on no import path, look in the
    current directory too. The directory goes last on the path, so a file there never
    shadows an installed module the bot itself imports later."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.partition(".")[0]
        here = os.getcwd()
        if exc.name != top or here in sys.path:
            raise
        sys.path.append(here)
        importlib.invalidate_caches()
        return importlib.import_module(module_name)
