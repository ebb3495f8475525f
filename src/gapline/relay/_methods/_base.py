"""What every method family shares: the method record, the call, sessions, parameter helpers.

Each method is ``async def m(call, params) -> result``; the HTTP and WebSocket transports
decode the request into ``params`` (a dict), pick the session, and encode the result or
:class:`RelayFailure` (a protocol-library error raised by a handler is mapped to its code
by ``_rpc.invoke``). Both transports therefore apply identical checks, state changes and
errors, as conventions.md requires.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gapline.meshline import MAX_SAFE_INTEGER
from gapline.relay._errors import RelayFailure
from gapline.relay._store import Session

__all__ = [
    "CAS_ATTEMPTS",
    "Call",
    "Connection",
    "Handler",
    "Method",
    "MethodTable",
    "SessionMode",
    "compact",
    "int_param",
    "member_name",
    "require",
    "stored",
    "text_param",
    "token_hash",
]


# How often a write decided on a read (compare-and-set) is decided again after losing a race
# to a concurrent one before the request gives up with ``state_conflict``.
CAS_ATTEMPTS = 8


class SessionMode(enum.Enum):
    """The session a method needs (the method index's column); the handler checks the mode."""

    NONE = "none"
    DEVICE = "device"
    ACCOUNT = "account"
    ANY = "any"  # device or account


class Connection(Protocol):
    """What a method may do to the WebSocket connection it was called on."""

    session: Session | None
    token_hash: str | None

    def bind(self, token_hash: str, session: Session) -> None: ...


@dataclass(slots=True)
class Call:
    """One invocation: the session the transport authenticated, and the WS connection if any."""

    session: Session | None = None
    connection: Connection | None = None
    extra: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[Call, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    http_verb: str  # GET, POST or PUT
    session: SessionMode
    handler: Handler
    # GET query fields and their types ("int" or "str").
    query: Mapping[str, str] = field(default_factory=dict)
    # True when the method has no result object (HTTP 204).
    no_content: bool = False


MethodTable = Mapping[str, Method]


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii", "replace")).hexdigest()


def compact(value: Any, *, sort_keys: bool = False) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)


_MEMBER_NAMES: dict[str, str] = {}


def member_name(name: str) -> str:
    """``"name":`` as json.dumps writes it; the few top-level names are cached."""
    text = _MEMBER_NAMES.get(name)
    if text is None:
        text = compact(name) + ":"
        if len(_MEMBER_NAMES) < 64:
            _MEMBER_NAMES[name] = text
    return text


def stored(text: str) -> Any:
    """A JSON text this relay wrote itself (already strictly validated on the way in)."""
    return json.loads(text)


def text_param(params: Mapping[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise RelayFailure("bad_request", f"{name}: expected a nonempty string")
    return value


def int_param(
    params: Mapping[str, Any], name: str, *, minimum: int, default: int | None = None
) -> int:
    if name not in params and default is not None:
        return default
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RelayFailure("bad_request", f"{name}: expected an integer")
    if not minimum <= value <= MAX_SAFE_INTEGER:
        raise RelayFailure("bad_request", f"{name}: out of range")
    return value


def require(call: Call, mode: SessionMode) -> Session:
    """The call's session, if its mode may call the method (``unauthorized``/``forbidden``)."""
    session = call.session
    if session is None:
        raise RelayFailure("unauthorized", "this method needs a session")
    if mode is SessionMode.DEVICE and session.mode != "device":
        raise RelayFailure("forbidden", "this method needs a device session")
    if mode is SessionMode.ACCOUNT and session.mode != "account":
        raise RelayFailure("forbidden", "this method needs an account session")
    return session
