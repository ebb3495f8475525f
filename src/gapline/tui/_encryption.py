"""What the terminal client shows of end-to-end encryption: the lock, why a row has no
text, and a device list with trust.

Pure functions of ``gapline.history`` values. An engine that takes part in
encrypted rooms answers ``is_encrypted(room_id)`` and ``devices(user_ids)``
(:class:`CryptoView`); an engine handle without them (a fake, an engine
opened without encryption) shows a lock only for rooms whose rows arrived
encrypted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from rich.text import Text

from gapline.history import Device, EventItem, TimelineItem, TrustLevel, Undecrypted, UtdReason

__all__ = ["LOCK", "CryptoView", "device_list", "room_encrypted", "utd_words"]

LOCK = "🔒"

_WHY = {
    UtdReason.MISSING_ROOM_KEY: "waiting for the sender's key",
    UtdReason.UNKNOWN_MESSAGE_INDEX: "the key held starts after this message",
    UtdReason.WITHHELD: "the sender withheld the key",
    UtdReason.MALFORMED: "the message is damaged or replayed",
    UtdReason.UNTRUSTED: "the key does not belong to the sender",
}

_TRUST = {
    TrustLevel.OWN: ("●", "this device", "bold"),
    TrustLevel.VERIFIED: ("✔", "verified: cross-signed under a trusted master key", "bold green"),
    TrustLevel.CROSS_SIGNED: ("✓", "cross-signed by its owner", "green"),
    TrustLevel.UNSIGNED: ("?", "not signed by its owner", "yellow"),
}


@runtime_checkable
class CryptoView(Protocol):
    """What an engine taking part in encrypted rooms tells the client."""

    def is_encrypted(self, room_id: str) -> bool: ...

    def devices(self, user_ids: Iterable[str]) -> dict[str, tuple[Device, ...]]: ...


def utd_words(undecrypted: Undecrypted) -> str:
    """A row that could not be decrypted says so, and why; it changes in place once its
    key arrives."""
    return f"unable to decrypt ({_WHY.get(undecrypted.reason, undecrypted.reason.value)})"


def room_encrypted(engine: object, room_id: str, items: Sequence[TimelineItem] | None) -> bool:
    """Whether to show the room's lock: its state says encrypted, or its rows arrived so."""
    if isinstance(engine, CryptoView) and engine.is_encrypted(room_id):
        return True
    return any(isinstance(i, EventItem) and i.encrypted for i in items or ())


def device_list(devices: Mapping[str, Sequence[Device]], names: Mapping[str, str | None]) -> Text:
    """The members' devices, each with its trust: own, cross-signed, or not signed."""
    text = Text("devices\n", style="bold")
    for user_id, found in devices.items():
        text.append(f"{names.get(user_id) or user_id}\n", style="bold")
        if not found:
            text.append("  no keys known yet\n", style="dim")
        for device in found:
            mark, words, style = _TRUST[device.trust]
            label = device.display_name or device.device_id
            text.append(f"  {mark} ", style=style)
            text.append(f"{label} ")
            text.append(f"({words})\n", style="dim")
    return text
