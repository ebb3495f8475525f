"""Strict readers of JSON fields, shared by the wire decoders.

Every reader takes the value and where it sits (``command.OpenRoom.room_id``)
and raises :class:`~gapline.history._wire.WireError` naming that place.
:class:`Fields` reads an object whose fields are all required except the
``optional`` ones, which may be left out (serde's ``#[serde(default)]``),
and refuses any field it does not know.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from typing import TypeVar

from gapline.history._wire import Json, WireError

__all__ = [
    "Fields",
    "bool_",
    "count",
    "describe",
    "enum_of",
    "event_id",
    "int_",
    "nonempty",
    "opt_enum_of",
    "opt_str",
    "positive",
    "room_id",
    "str_",
    "str_list",
    "variant",
]

E = TypeVar("E", bound=enum.Enum)
T = TypeVar("T")


def describe(value: Json) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def variant(
    value: Json, where: str, units: tuple[str, ...], datas: tuple[str, ...]
) -> tuple[str, Json]:
    """Split an externally tagged enum value into (variant name, payload)."""
    known = ", ".join([*units, *datas])
    if isinstance(value, str):
        if value in units:
            return value, None
        if value in datas:
            raise WireError(f"{where}: {value} needs data, as {{{json.dumps(value)}: ...}}")
        raise WireError(f"{where}: unknown variant {json.dumps(value)} (expected one of {known})")
    if isinstance(value, dict):
        if len(value) != 1:
            raise WireError(
                f"{where}: an enum value is a bare string or an object with one key, "
                f"got {len(value)} keys"
            )
        ((name, payload),) = value.items()
        if name in datas:
            return name, payload
        if name in units:
            raise WireError(f"{where}: {name} takes no data; write {json.dumps(name)}")
        raise WireError(f"{where}: unknown variant {json.dumps(name)} (expected one of {known})")
    raise WireError(f"{where}: expected a string or a one-key object, got {describe(value)}")


class Fields:
    """Strict access to an object's fields: every field read, none unknown, types checked.

    ``optional`` fields may be absent; :meth:`get` then answers ``None`` (or the
    ``default`` it is given) without calling the reader.
    """

    def __init__(
        self, value: Json, where: str, names: tuple[str, ...], optional: tuple[str, ...] = ()
    ) -> None:
        if not isinstance(value, dict):
            raise WireError(f"{where}: expected an object, got {describe(value)}")
        known = (*names, *optional)
        unknown = [k for k in value if k not in known]
        if unknown:
            raise WireError(
                f"{where}: unknown field {json.dumps(unknown[0])} (fields: {', '.join(known)})"
            )
        missing = [k for k in names if k not in value]
        if missing:
            raise WireError(f"{where}: missing field {json.dumps(missing[0])}")
        self._value: Mapping[str, Json] = value
        self._where = where

    def get(self, name: str, check: Callable[[Json, str], T]) -> T:
        return check(self._value[name], f"{self._where}.{name}")

    def opt(self, name: str, check: Callable[[Json, str], T], default: T | None = None) -> T | None:
        """An optional field: ``default`` when absent or ``null``."""
        value = self._value.get(name)
        return default if value is None else check(value, f"{self._where}.{name}")


def str_(value: Json, where: str) -> str:
    if not isinstance(value, str):
        raise WireError(f"{where}: expected a string, got {describe(value)}")
    return value


def nonempty(value: Json, where: str) -> str:
    text = str_(value, where)
    if not text:
        raise WireError(f"{where}: must not be empty")
    return text


def event_id(value: Json, where: str) -> str:
    text = str_(value, where)
    if len(text) < 2 or not text.startswith("$"):
        raise WireError(
            f"{where}: expected a Matrix event ID starting with '$', got {describe(text)}"
        )
    return text


def room_id(value: Json, where: str) -> str:
    # Commands only (events come from the engine and are taken as written).
    # Only the sigil is checked: room versions 12+ drop the ":server" part.
    text = str_(value, where)
    if len(text) < 2 or not text.startswith("!"):
        raise WireError(
            f"{where}: expected a Matrix room ID starting with '!', got {describe(text)}"
        )
    return text


def opt_str(value: Json, where: str) -> str | None:
    return None if value is None else str_(value, where)


def int_(value: Json, where: str) -> int:
    # bool is an int subclass in Python; true is not a number on the wire.
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{where}: expected an integer, got {describe(value)}")
    return value


def count(value: Json, where: str) -> int:
    number = int_(value, where)
    if number < 0:
        raise WireError(f"{where}: must not be negative, got {number}")
    return number


MAX_SAFE_INT = 2**53 - 1  # what every JSON reader represents exactly


def positive(value: Json, where: str) -> int:
    # Commands' counts: bounded, so a 4,000-digit count never reaches the engine.
    number = int_(value, where)
    if number < 1:
        raise WireError(f"{where}: must be at least 1, got {number}")
    if number > MAX_SAFE_INT:
        raise WireError(f"{where}: outside -(2^53-1)..2^53-1, got {describe(number)}")
    return number


def bool_(value: Json, where: str) -> bool:
    if not isinstance(value, bool):
        raise WireError(f"{where}: expected true or false, got {describe(value)}")
    return value


def str_list(value: Json, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array, got {describe(value)}")
    return tuple(str_(v, f"{where}[{i}]") for i, v in enumerate(value))


def enum_of(kind: type[E]) -> Callable[[Json, str], E]:
    def check(value: Json, where: str) -> E:
        for member in kind:
            if member.value == value:
                return member
        names = ", ".join(json.dumps(m.value) for m in kind)
        raise WireError(f"{where}: expected one of {names}, got {describe(value)}")

    return check


def opt_enum_of(kind: type[E]) -> Callable[[Json, str], E | None]:
    check = enum_of(kind)

    def opt(value: Json, where: str) -> E | None:
        return None if value is None else check(value, where)

    return opt
