"""Flag values checked where they are parsed, so a bad one is a usage error (status 2)
with the flag's name, never a failure deep inside a database or a request."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from urllib.parse import urlsplit

__all__ = [
    "bounded_int",
    "dsn",
    "event_id",
    "homeserver_url",
    "is_postgres",
    "positive_float",
    "positive_int",
    "room_id",
    "shown",
    "user_id",
]

_POSTGRES = ("postgresql://", "postgres://")


def is_postgres(value: str) -> bool:
    return value.startswith(_POSTGRES)


def homeserver_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"expected an http:// or https:// URL, e.g. https://matrix.example.org, not {text!r}"
        )
    return text


_MAX_ID_BYTES = 255  # the Matrix limit on user, room and event IDs


def shown(text: str) -> str:
    """``text`` quoted for an error line, cut short: a hostile value never floods stderr."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _identifier(text: str, sigil: str, what: str, example: str) -> str:
    if len(text.encode("utf-8", "surrogatepass")) > _MAX_ID_BYTES:
        raise argparse.ArgumentTypeError(
            f"{what} is at most {_MAX_ID_BYTES} bytes, not {shown(text)}"
        )
    if (
        len(text) < 2
        or not text.startswith(sigil)
        or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in text)
    ):
        raise argparse.ArgumentTypeError(
            f"expected {what} starting with {sigil!r}, e.g. {example}, not {shown(text)}"
        )
    return text


def user_id(text: str) -> str:
    checked = _identifier(text, "@", "a Matrix user ID", "@alice:example.org")
    local, sep, server = checked[1:].partition(":")
    if not local or not sep or not server:
        raise argparse.ArgumentTypeError(
            f"expected a full Matrix user ID @name:server, e.g. @alice:example.org, not {text!r}"
        )
    return checked


def room_id(text: str) -> str:
    # Room versions 12 and later drop the server name, so only the sigil is checked;
    # an alias (#room:server) is not resolved.
    return _identifier(text, "!", "a room ID (not an alias)", "'!abc:example.org'")


def event_id(text: str) -> str:
    return _identifier(text, "$", "an event ID", "'$abc'")


def dsn(text: str) -> str:
    """A SQLite file path or a ``postgresql://`` URL."""
    if not text:
        raise argparse.ArgumentTypeError("expected a SQLite file path or a postgresql:// URL")
    scheme, sep, _ = text.partition("://")
    if sep and not is_postgres(text) and scheme.isalnum():
        raise argparse.ArgumentTypeError(
            f"unknown database URL scheme {scheme + '://'!r}: use a SQLite file path "
            "or a postgresql:// URL"
        )
    if text == ":memory:" or text.startswith("file:"):
        raise argparse.ArgumentTypeError(
            f"expected a SQLite file path (several connections share it), not {text!r}"
        )
    return text


_MAX_DIGITS = 15  # below 2^53: every flag's count or size fits, and int() stays cheap


def positive_int(text: str) -> int:
    # Digits are counted before converting: int() of thousands of digits refuses, and
    # non-ASCII digits ("٣") are not a flag value anyone means.
    if not (text.isascii() and text.isdigit()) or len(text) > _MAX_DIGITS or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, not {shown(text)}")
    return int(text)


def bounded_int(maximum: int) -> Callable[[str], int]:
    """A ``positive_int`` flag type that also refuses values above ``maximum``."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"at most {maximum:,}, not {shown(text)}")
        return value

    return parse


def positive_float(text: str) -> float:
    if len(text) > 32:
        raise argparse.ArgumentTypeError(f"expected a positive number, not {shown(text)}")
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, not {shown(text)}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, not {shown(text)}")
    return value
