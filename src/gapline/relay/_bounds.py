"""Bounded, typed parsing of everything a client sends, before any work is done on it.

Every value that reaches a method came through here: query fields, JSON bodies,
WebSocket frames and the session header. Each check runs before the value is
converted or stored, so its cost is bounded by the bytes the client sent and no
input can make a conversion raise (``int()`` of 5,000 digits refuses with
``ValueError``; a bounded digit count never gets there). Every violation is a
:class:`RelayFailure` ``bad_request``; sizes over the request limit are
``request_too_large``, which the transports check before reading.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from gapline.meshline import MAX_SAFE_INTEGER, MeshlineError, parse_json
from gapline.relay._errors import RelayFailure

__all__ = [
    "MAX_ITEMS",
    "MAX_QUERY_FIELDS",
    "MAX_QUERY_VALUE",
    "MAX_TOKEN",
    "address_key",
    "check_items",
    "parse_params",
    "query_params",
    "session_token",
]

# The safe-integer bound has 16 decimal digits: a longer text is out of range without
# converting it (one more for the sign).
_MAX_INT_DIGITS = len(str(MAX_SAFE_INTEGER))
_INT_RE = re.compile(r"-?(0|[1-9][0-9]*)")
_TOKEN_RE = re.compile(r"[\x21-\x7e]{1,256}")

MAX_TOKEN = 256
"""Longest session token (the spec's 1..256 visible ASCII)."""

MAX_QUERY_VALUE = 4096
"""Longest query value in characters (an account ID is under 100)."""

MAX_QUERY_FIELDS = 64
"""Most query fields one GET may carry, known or not."""

MAX_ITEMS = 1024
"""Most elements of one JSON array, or members of one object, anywhere in a body or frame.

No parameter object of the protocol comes near it (key-box sets hold at most 8,
device states 8 certificates); the bound keeps a 1 MiB body of ``[0,0,…]`` from
costing the methods anything."""


def query_params(query: Mapping[str, str], fields: Mapping[str, str]) -> dict[str, Any]:
    """The method's query fields, typed: ``int`` fields are shortest-form safe decimals.

    ``query`` is the decoded multi-dict (``getall``); unknown names are ignored, but
    counted, so a query of 10,000 names is refused before anything looks at them.
    """
    if len(query) > MAX_QUERY_FIELDS:
        raise RelayFailure("bad_request", f"more than {MAX_QUERY_FIELDS} query fields")
    getall = getattr(query, "getall", None)
    params: dict[str, Any] = {}
    for name, kind in fields.items():
        values = getall(name, []) if getall is not None else [query[name]] * (name in query)
        if not values:
            continue
        if len(values) > 1:
            raise RelayFailure("bad_request", f"{name}: query field repeated")
        text = values[0]
        if len(text) > MAX_QUERY_VALUE:
            raise RelayFailure("bad_request", f"{name}: longer than {MAX_QUERY_VALUE} characters")
        params[name] = _query_int(name, text) if kind == "int" else text
    return params


def _query_int(name: str, text: str) -> int:
    if _INT_RE.fullmatch(text) is None or text == "-0":
        raise RelayFailure("bad_request", f"{name}: not a shortest-form decimal integer")
    # Counted before converting: int() of thousands of digits is slow, or refused.
    if len(text) - text.startswith("-") > _MAX_INT_DIGITS:
        raise RelayFailure("bad_request", f"{name}: outside the safe integer range")
    value = int(text)
    if abs(value) > MAX_SAFE_INTEGER:
        raise RelayFailure("bad_request", f"{name}: outside the safe integer range")
    return value


def parse_params(raw: bytes | str, what: str = "the request body") -> Any:
    """Strict protocol JSON (depth, integers, duplicates: :func:`parse_json`), then sizes.

    Arrays and objects are bounded by :data:`MAX_ITEMS`. The walk that checks it runs
    only when the text has more separators than that, so a typical request (a few
    dozen commas) pays one ``count``.
    """
    try:
        value = parse_json(raw)
    except MeshlineError as exc:
        raise RelayFailure("bad_request", exc.message) from None
    check_items(value, raw, what)
    return value


def check_items(value: Any, raw: bytes | str, what: str) -> None:
    """Refuse an array or object of more than :data:`MAX_ITEMS` in ``value`` (parsed from ``raw``)."""
    # n items need n-1 commas, and commas inside strings only over-count.
    if (raw.count(b",") if isinstance(raw, bytes) else raw.count(",")) < MAX_ITEMS:
        return
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if len(node) > MAX_ITEMS:
                raise RelayFailure(
                    "bad_request", f"{what}: an object with over {MAX_ITEMS} members"
                )
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            if len(node) > MAX_ITEMS:
                raise RelayFailure("bad_request", f"{what}: an array with over {MAX_ITEMS} items")
            stack.extend(v for v in node if isinstance(v, dict | list))


def session_token(value: str | None) -> str | None:
    """The session header's token if it is well-formed (1..256 visible ASCII), else None.

    Checked before it is hashed, so an 8 KiB header costs one regex, not a digest.
    """
    if value is None or len(value) > MAX_TOKEN or _TOKEN_RE.fullmatch(value) is None:
        return None
    return value


def address_key(remote: str | None) -> str:
    """The key an address is charged and counted under.

    IPv4 addresses as they are; IPv6 by their /64, the block one subscriber gets, so
    a client cannot pick a fresh address (and fresh buckets) per request.
    """
    if not remote:
        return "?"
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote[:64]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
