"""Flag values checked where they are parsed, so a bad one is a usage error (status 2)
with the flag's name, never a failure deep inside a database or a request."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

__all__ = [
    "dsn",
    "event_id",
    "homeserver_url",
    "is_postgres",
    "positive_float",
    "positive_int",
    "room_id",
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


def _identifier(text: str, sigil: str, what: str, example: str) -> str:
    if len(text) < 2 or not text.startswith(sigil) or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"expected {what} starting with {sigil!r}, e.g. {example}, not {text!r}"
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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive whole number, not {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, not {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, not {text!r}")
    return value
