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

A handler may take a third argument, the :class:`Turn` it runs in:
``await turn.request_approval(call)`` posts an approval card for one exact tool
call and returns the decision (``approve`` is the built-in example), and
``await turn.accept_reactions("👍", "👎")`` makes the answer interactive: a
reaction with one of those keys is a turn of its own, dispatched to the same
handler once, with ``message.reaction`` set.

Handlers are looked up by name: a built-in name (``echo``, ``approve``) or
``package.module:function`` for your own, found on the import path or, failing
that, in the current directory (``myhandlers.py`` beside where ``gapline bot``
runs), as ``python script.py`` would find a module beside the script.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, cast

from gapline.journal._types import Approval, ConversationRow, Cursor, ToolCall

__all__ = [
    "BUILTIN_HANDLERS",
    "Conversation",
    "Final",
    "Handler",
    "HandlerError",
    "HandlerStream",
    "Progress",
    "Reaction",
    "TriggerMessage",
    "Turn",
    "TurnHandler",
    "approve",
    "echo",
    "resolve_handler",
    "with_turn",
]


@dataclass(frozen=True, slots=True)
class Reaction:
    """A reaction a turn asked for: its key, and the message of ours it is on."""

    key: str
    target_event_id: str


@dataclass(frozen=True, slots=True)
class TriggerMessage:
    """The message a handler answers (already durable in the journal).

    For a reaction turn (``accept_reactions``), ``reaction`` is set and ``body`` is
    the reaction's key; ``event_id`` is the reaction's own id.
    """

    room_id: str
    event_id: str
    sender: str
    body: str
    thread_id: str | None
    origin_server_ts: int
    reaction: Reaction | None = None


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


class Turn(Protocol):
    """The turn a handler runs in (its optional third argument)."""

    @property
    def turn_id(self) -> str: ...

    async def request_approval(
        self,
        call: ToolCall,
        *,
        approvers: Iterable[str] | None = None,
        expires_in: float | None = None,
    ) -> Approval:
        """Post an approval card for exactly ``call`` and wait for its decision.

        ``approvers``: who may decide (default: the bot's ``--approver`` users, else the
        sender of the message). No decision within ``expires_in`` seconds is
        ``Decision.EXPIRED``. A rerun of the turn asking the same calls in the same order
        gets the decisions already made, at once, without a second card.
        ``Decision.CANCELLED`` means the bot left the room (the answer will be refused as
        well).
        """
        ...

    async def accept_reactions(self, *keys: str) -> None:
        """Reactions with one of ``keys`` on this turn's answer become turns of their own,
        each dispatched to this handler once (``message.reaction`` set)."""
        ...


HandlerStream: TypeAlias = AsyncIterator[Progress | Final]
TurnHandler: TypeAlias = Callable[[Conversation, TriggerMessage, Turn], HandlerStream]
Handler: TypeAlias = Callable[[Conversation, TriggerMessage], HandlerStream] | TurnHandler


def _takes_turn(handler: Callable[..., object]) -> bool:
    try:
        parameters = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional) >= 3 or any(
        p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters
    )


def with_turn(handler: Handler) -> TurnHandler:
    """``handler`` called as ``(conversation, message, turn)``: as it is when it takes a
    third argument, else with the turn left out."""
    if _takes_turn(handler):
        return cast(TurnHandler, handler)
    two = cast(Callable[[Conversation, TriggerMessage], HandlerStream], handler)

    def adapted(conversation: Conversation, message: TriggerMessage, turn: Turn) -> HandlerStream:
        del turn
        return two(conversation, message)

    return adapted


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


async def approve(conversation: Conversation, message: TriggerMessage, turn: Turn) -> HandlerStream:
    """Ask before answering: an approval card for the exact call ``echo`` with the
    message's text, then ``echo: <body>`` when approved, or a refusal that says why."""
    del conversation
    call = ToolCall("echo", {"text": message.body})
    yield Progress("asking for approval…")
    approval = await turn.request_approval(call)
    if approval.approved:
        yield Final(f"echo: {message.body}")
    else:
        decision = approval.decision.value if approval.decision else "undecided"
        yield Final(f"not approved ({decision}): echo {message.body!r}")


BUILTIN_HANDLERS: dict[str, Handler] = {"echo": echo, "approve": approve}


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
