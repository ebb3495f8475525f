"""Strict field readers shared by the object parsers.

Each wire object keeps its unknown fields (``extensions``) because signatures
and digests cover them and the spec requires they be preserved recursively.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gapline.meshline._base64 import b64u_decode
from gapline.meshline._canonical import MAX_SAFE_INTEGER
from gapline.meshline._errors import BadRequest, WireContextForbidden

__all__ = [
    "b64_field",
    "bool_field",
    "extensions",
    "int_field",
    "no_nulls",
    "object_of",
    "str_field",
    "type_field",
]


def object_of(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadRequest(f"{what}: expected an object")
    if "$context" in value:
        raise WireContextForbidden(f"{what}: a protocol object must not carry $context")
    return value


def type_field(obj: Mapping[str, Any], expected: str) -> str:
    value = obj.get("$type")
    if value != expected:
        raise BadRequest(f"$type must be {expected!r}, got {value!r}")
    return expected


def str_field(obj: Mapping[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise BadRequest(f"{name}: expected a string")
    return value


def int_field(obj: Mapping[str, Any], name: str, *, minimum: int = -MAX_SAFE_INTEGER) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{name}: expected an integer")
    if not minimum <= value <= MAX_SAFE_INTEGER:
        raise BadRequest(f"{name}: out of range")
    return value


def bool_field(obj: Mapping[str, Any], name: str) -> bool:
    value = obj.get(name)
    if not isinstance(value, bool):
        raise BadRequest(f"{name}: expected a boolean")
    return value


def no_nulls(value: Any, where: str) -> None:
    """``null`` is invalid unless a field allows it (general.md); none of ours does,
    and an unknown field cannot declare that it does."""
    stack = [(value, where)]
    while stack:
        node, path = stack.pop()
        if node is None:
            raise BadRequest(f"{path}: null is not allowed")
        if isinstance(node, Mapping):
            stack.extend((child, f"{path}.{key}") for key, child in node.items())
        elif isinstance(node, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node))


def b64_field(obj: Mapping[str, Any], name: str, length: int | None = None) -> str:
    """The field's text after checking it is canonical base64url (of ``length`` bytes)."""
    value = obj.get(name)
    b64u_decode(value, length=length, field=name)
    assert isinstance(value, str)
    return value


def extensions(obj: Mapping[str, Any], known: frozenset[str]) -> Mapping[str, Any]:
    return {k: v for k, v in obj.items() if k not in known}
