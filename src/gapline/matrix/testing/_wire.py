"""The HTTP vocabulary every endpoint family of the fake shares.

A handler gets a `Call` (the request, its query and its decoded JSON body)
and returns a `Reply`, or raises `HTTPError` for a Matrix error answer; only
`respond` turns a reply into an ``httpx.Response``. Pagination tokens and
query parameters are parsed here so every family rejects a bad one alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "Call",
    "HTTPError",
    "Handler",
    "Reply",
    "filter_json",
    "int_param",
    "parse_token",
    "respond",
    "sync_token",
    "token",
]

_TOKEN_SUFFIX = "_0_0_0_0_0_0_0_0"
_TOKEN_RE = re.compile(r"^(?:t(\d+)-(\d+)|s(\d+))(?:_\d+)*$")


@dataclass(frozen=True)
class Call:
    """One request as a handler sees it (path parameters are bound by the router)."""

    request: httpx.Request
    query: dict[str, str]
    body: Any = None


@dataclass
class Reply:
    """A handler's answer: a JSON ``body``, or ``raw`` bytes (media, a cut-short body)."""

    status: int = 200
    body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Call], Awaitable[Reply]]


class HTTPError(Exception):
    """A Matrix error answer (``errcode`` and ``error``, plus any extra fields)."""

    def __init__(self, status: int, errcode: str, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.reply = Reply(status, {"errcode": errcode, "error": error, **extra})


def respond(reply: Reply) -> httpx.Response:
    if reply.raw is not None:
        content = reply.raw
        headers = {
            "content-type": reply.headers.get("content-type", "application/json"),
            **reply.headers,
        }
    else:
        content = json.dumps(reply.body if reply.body is not None else {}).encode()
        headers = {"content-type": "application/json", **reply.headers}
    return httpx.Response(reply.status, content=content, headers=headers)


def token(stream: int) -> str:
    """A ``/messages`` token: "between stream positions ``stream`` and ``stream + 1``"."""
    return f"t{stream}-{stream}{_TOKEN_SUFFIX}"


def sync_token(stream: int) -> str:
    return f"s{stream}{_TOKEN_SUFFIX}"


def parse_token(value: str) -> int:
    """The stream position of a ``/messages`` or ``/sync`` token (400 if it does not parse)."""
    match = _TOKEN_RE.match(value)
    if match is None:
        raise HTTPError(400, "M_INVALID_PARAM", f"Invalid token: {value!r}")
    return int(match.group(2) or match.group(3))


def int_param(query: dict[str, str], key: str, default: int) -> int:
    """A non-negative integer query parameter (400 otherwise)."""
    if key not in query:
        return default
    try:
        value = int(query[key])
    except ValueError:
        raise HTTPError(400, "M_INVALID_PARAM", f"{key} must be an integer") from None
    if value < 0:
        raise HTTPError(400, "M_INVALID_PARAM", f"{key} must be >= 0")
    return value


def filter_json(raw: str | None) -> dict[str, Any]:
    """An inline JSON ``filter`` parameter; a filter ID (or none) filters nothing."""
    if raw is None or not raw.startswith("{"):
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise HTTPError(400, "M_NOT_JSON", "filter is not JSON") from None
    return value if isinstance(value, dict) else {}
