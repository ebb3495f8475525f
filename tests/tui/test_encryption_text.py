"""What the terminal client shows of encryption: UTD rows say why, the lock, the devices."""

from __future__ import annotations

from collections.abc import Iterable

from gapline.history import Device, EventItem, TrustLevel, Undecrypted, UtdReason
from gapline.tui._encryption import LOCK, device_list, room_encrypted
from gapline.tui._text import event_body, item_line


def _row(
    *,
    event_type: str = "m.room.encrypted",
    body: str | None = None,
    encrypted: bool = False,
    decryption: Undecrypted | None = None,
) -> EventItem:
    return EventItem(id="$e", event_id="$e", sender="@b:x", origin_server_ts=1,
                     event_type=event_type, body=body, encrypted=encrypted,
                     decryption=decryption)  # fmt: skip


def test_a_utd_row_says_why_and_the_healed_row_shows_the_message() -> None:
    utd = _row(encrypted=True, decryption=Undecrypted("s1", UtdReason.MISSING_ROOM_KEY))
    assert event_body(utd) == ("unable to decrypt (waiting for the sender's key)", True)
    assert "unable to decrypt (waiting for the sender's key)" in item_line(utd)
    withheld = _row(encrypted=True, decryption=Undecrypted("s1", UtdReason.WITHHELD))
    assert event_body(withheld)[0] == "unable to decrypt (the sender withheld the key)"
    healed = _row(event_type="m.room.message", body="hello", encrypted=True)
    assert event_body(healed) == ("hello", False)


class _Engine:
    def __init__(self, encrypted: set[str]) -> None:
        self.encrypted = encrypted

    def is_encrypted(self, room_id: str) -> bool:
        return room_id in self.encrypted

    def devices(self, user_ids: Iterable[str]) -> dict[str, tuple[Device, ...]]:
        return {u: () for u in user_ids}


def test_the_lock_comes_from_the_room_state_or_its_rows() -> None:
    assert room_encrypted(_Engine({"!a:x"}), "!a:x", ())
    assert not room_encrypted(_Engine(set()), "!a:x", (_row(event_type="m.room.message"),))
    assert room_encrypted(object(), "!a:x", (_row(encrypted=True),))
    assert LOCK == "🔒"


def test_the_device_list_shows_trust() -> None:
    def device(device_id: str, trust: TrustLevel, name: str | None = None) -> Device:
        return Device(user_id="@b:x", device_id=device_id, curve25519="c", ed25519="e",
                      algorithms=(), display_name=name, trust=trust)  # fmt: skip

    text = device_list(
        {"@b:x": (device("PHONE", TrustLevel.CROSS_SIGNED, "phone"), device("OLD", TrustLevel.UNSIGNED)),
         "@c:x": ()},
        {"@b:x": "Bob"},
    ).plain  # fmt: skip
    assert "Bob\n  ✓ phone (cross-signed by its owner)\n  ? OLD (not signed by its owner)" in text
    assert "@c:x\n  no keys known yet" in text
