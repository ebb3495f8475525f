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


async def test_a_utd_row_says_why_then_becomes_the_message_in_place() -> None:
    """In the app: the lock in the title, the UTD row's reason, and the same row (same
    widget) showing the message once a Set diff heals it."""
    from gapline.history import Set as SetDiff
    from gapline.history import TimelineChanged
    from tests.tui.fake_engine import ROOM, message
    from tests.tui.support import make_app, until

    utd = message(2, event_type="m.room.encrypted", body=None, encrypted=True,
                  decryption=Undecrypted("s1", UtdReason.MISSING_ROOM_KEY))  # fmt: skip
    app, fake = make_app([message(1, encrypted=True), utd])
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 2, "the rows")
        title = str(app.query_one("#room-title").render())
        assert title.startswith(LOCK)
        [row] = [r for r in app.timeline.rows if getattr(r.item, "event_id", None) == "$e2"]
        assert "unable to decrypt (waiting for the sender's key)" in str(row.render())
        healed = message(2, body="the message, decrypted", encrypted=True)
        await fake.publish(TimelineChanged(ROOM, (SetDiff(1, healed),)))
        await until(pilot, lambda: "the message, decrypted" in str(row.render()), "the heal")
        assert [r for r in app.timeline.rows if getattr(r.item, "event_id", None) == "$e2"] == [row]
