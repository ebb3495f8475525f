"""The shape of one Matrix HTTP call, and the path and query helpers every builder uses.

Kept apart from the builders so that each family of endpoints (`_api`, `_api_crypto`)
can build on it without importing the others.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import msgspec

__all__ = ["CLIENT_V1", "CLIENT_V3", "MEDIA_V3", "Direction", "Request"]

CLIENT_V3 = "/_matrix/client/v3"
CLIENT_V1 = "/_matrix/client/v1"
MEDIA_V3 = "/_matrix/media/v3"


class Direction(enum.StrEnum):
    """Pagination direction of ``/messages`` and ``/relations``."""

    BACKWARD = "b"
    FORWARD = "f"


@dataclass(frozen=True, slots=True)
class Request:
    """One Matrix HTTP call, fully described and not yet sent.

    ``path`` is already percent-encoded. ``json`` is a JSON-able body (or
    ``None``); ``content`` carries raw bytes instead (media upload).
    ``idempotent`` tells the client it may retry the call after a timeout or
    a 5xx without risking a duplicate effect. ``long_poll_ms`` is how long the
    server may legitimately hold the request (``/sync``'s ``timeout``): the
    client adds it to its read timeout.
    """

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    json: Any = None
    content: bytes | None = field(default=None, repr=False)
    content_type: str | None = None
    authenticated: bool = True
    idempotent: bool = True
    long_poll_ms: int | None = None

    @property
    def target(self) -> str:
        """The path with its query string, for logs and error messages."""
        if not self.query:
            return self.path
        return f"{self.path}?{urlencode(self.query)}"


def _path(prefix: str, *segments: str) -> str:
    # quote(..., safe="") encodes "/" too: "!a/b:x" must stay ONE segment.
    return prefix + "".join("/" + quote(str(s), safe="") for s in segments)


def _q(**params: object) -> tuple[tuple[str, str], ...]:
    """Query pairs in argument order, dropping ``None``; booleans as ``true``/``false``."""
    out: list[tuple[str, str]] = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out.append((key.rstrip("_"), "true" if value else "false"))
        else:
            out.append((key.rstrip("_"), str(value)))
    return tuple(out)


def _filter_param(value: str | Mapping[str, Any] | None) -> str | None:
    """A filter is either a stored filter ID or an inline JSON object."""
    if value is None or isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()
