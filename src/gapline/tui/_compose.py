"""What a compose box's text asks for: a message, or one of the slash commands.

:func:`parse` turns the text into one typed value and never sends anything;
:func:`command_for` turns that value into the engine command for a room.

- plain text is a message (markdown, rendered to HTML by the engine);
- ``/me waves`` is an emote, ``/notice text`` a notice, ``/plain text`` a
  message sent as typed (no markdown);
- ``/join #alias:server`` or ``/join !id``, ``/leave``, ``/invite @user:server``,
  ``/topic new topic`` change rooms;
- ``//text`` sends ``/text`` (the escape for a message that starts with a slash);
- anything else starting with ``/`` is an unknown command: a clear error that
  lists the known ones, and nothing is sent.

Only the first word decides; a message may span lines (``/me`` too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from gapline.history import Command, InviteUser, JoinRoom, LeaveRoom, SendMessage, SetTopic

__all__ = [
    "COMMANDS",
    "ComposeError",
    "Invite",
    "Join",
    "Leave",
    "Parsed",
    "Say",
    "Topic",
    "command_for",
    "parse",
]

COMMANDS = {
    "/me": "/me ACTION: an emote (* you ACTION)",
    "/notice": "/notice TEXT: a notice",
    "/plain": "/plain TEXT: a message sent as typed, no markdown",
    "/join": "/join #alias:server or !room-id: join a room",
    "/leave": "/leave: leave this room",
    "/invite": "/invite @user:server: invite someone to this room",
    "/topic": "/topic TEXT: set this room's topic",
}
"""Each slash command and how it is used (the help and the errors show these)."""


@dataclass(frozen=True, slots=True)
class Say:
    """A message to send: ``msgtype`` ``m.text``, ``m.emote`` or ``m.notice``."""

    body: str
    msgtype: str = "m.text"
    markdown: bool = True


@dataclass(frozen=True, slots=True)
class Join:
    room: str


@dataclass(frozen=True, slots=True)
class Leave:
    pass


@dataclass(frozen=True, slots=True)
class Invite:
    user_id: str


@dataclass(frozen=True, slots=True)
class Topic:
    topic: str


@dataclass(frozen=True, slots=True)
class ComposeError:
    """Why the text is not sent (shown to the user; the text stays in the box)."""

    message: str


Parsed: TypeAlias = Say | Join | Leave | Invite | Topic | ComposeError


def _usage(name: str) -> ComposeError:
    return ComposeError(f"usage: {COMMANDS[name]}")


def _is_room(text: str) -> bool:
    if text.startswith("!") and len(text) >= 2:
        return True
    return text.startswith("#") and ":" in text and len(text) >= 4


def _is_user(text: str) -> bool:
    return text.startswith("@") and ":" in text and len(text) >= 4


def parse(text: str) -> Parsed | None:
    """What ``text`` asks for; ``None`` when there is nothing to send (only blanks)."""
    text = text.strip()
    if not text:
        return None
    if text.startswith("//"):
        return Say(text[1:])
    if not text.startswith("/"):
        return Say(text)
    head, _, rest = text.partition(" ")
    if "\n" in head:
        head, _, more = head.partition("\n")
        rest = f"{more}\n{rest}" if rest else more
    name, arg = head.lower(), rest.strip()
    match name:
        case "/me" | "/notice" | "/plain":
            if not arg:
                return _usage(name)
            if name == "/plain":
                return Say(arg, markdown=False)
            return Say(arg, "m.emote" if name == "/me" else "m.notice")
        case "/join":
            return Join(arg) if _is_room(arg) else _usage(name)
        case "/leave":
            return Leave() if not arg else _usage(name)
        case "/invite":
            return Invite(arg) if _is_user(arg) else _usage(name)
        case "/topic":
            return Topic(arg) if arg else _usage(name)
    known = " ".join(COMMANDS)
    return ComposeError(f"unknown command {head}: known are {known}; // sends a leading /")


def command_for(
    parsed: Say | Join | Leave | Invite | Topic,
    room_id: str,
    *,
    in_reply_to: str | None = None,
    thread_root: str | None = None,
) -> Command:
    """The engine command for ``parsed`` in ``room_id`` (a reply or thread for a message)."""
    match parsed:
        case Say(body=body, msgtype=msgtype, markdown=markdown):
            return SendMessage(
                room_id,
                body,
                in_reply_to=in_reply_to,
                thread_root=thread_root,
                msgtype=msgtype,
                markdown=markdown,
            )
        case Join(room=room):
            return JoinRoom(room)
        case Leave():
            return LeaveRoom(room_id)
        case Invite(user_id=user_id):
            return InviteUser(room_id, user_id)
        case Topic(topic=topic):
            return SetTopic(room_id, topic)
