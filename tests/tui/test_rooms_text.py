"""The room directory, the command glue on the fake homeserver, and the rows' wording."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import msgspec
from textual.widgets import OptionList

from gapline.history import (
    EngineConfig,
    RecentHistoryKind,
    RecentHistoryState,
)
from gapline.history.rooms import RoomDirectory, RoomSummary
from gapline.matrix import RetryPolicy, SyncResponse
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import KdfParams
from gapline.tui import GaplineApp, item_line, recent_label
from gapline.tui._timeline import EventRow
from gapline.tui.cli import engine_connect
from tests.tui.fake_engine import message
from tests.tui.support import until


def _sync(rooms: dict, leave: tuple[str, ...] = ()) -> SyncResponse:
    body = {"next_batch": "s1", "rooms": {"join": rooms, "leave": {r: {} for r in leave}}}
    return msgspec.json.decode(msgspec.json.encode(body), type=SyncResponse)


def _state(event_type: str, content: dict) -> dict:
    return {
        "event_id": f"${event_type}",
        "type": event_type,
        "sender": "@a:x",
        "origin_server_ts": 1,
        "content": content,
        "state_key": "",
    }


def test_directory_names_rooms_from_syncs_and_tells_listeners() -> None:
    directory = RoomDirectory()
    calls: list[None] = []
    unsubscribe = directory.subscribe(lambda: calls.append(None))
    directory.observe(
        _sync(
            {
                "!b:x": {"state": {"events": [_state("m.room.name", {"name": "beta"})]}},
                "!a:x": {
                    "state": {"events": [_state("m.room.canonical_alias", {"alias": "#al:x"})]},
                    "unread_notifications": {"notification_count": 3},
                },
                "!c:x": {},
            }
        )
    )
    assert [(s.label, s.unread) for s in directory.summaries()] == [
        ("!c:x", 0),
        ("#al:x", 3),
        ("beta", 0),
    ]
    assert len(calls) == 1
    # a rename in the timeline, the same answer again (no change), a leave
    rename = {"timeline": {"events": [_state("m.room.name", {"name": "Alpha"})]}}
    directory.observe(_sync({"!a:x": rename}))
    directory.observe(_sync({"!a:x": rename}))
    assert directory.get("!a:x") == RoomSummary(
        "!a:x", name="Alpha", alias="#al:x", unread=0, last_ts=1
    )  # the rename's time: the room's recent activity
    assert len(calls) == 2
    directory.observe(_sync({}, leave=("!c:x",)))
    assert [s.label for s in directory.summaries()] == ["Alpha", "beta"]
    unsubscribe()
    directory.put(RoomSummary("!d:x", name="delta"))
    assert len(calls) == 3


async def test_the_command_glue_lists_rooms_and_switches_between_them(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    alice = fake.register("alice")
    first = fake.create_room(alice.user_id, name="zulu")
    second = fake.create_room(alice.user_id, name="alpha")
    fake.send_messages(alice.user_id, first, ["in zulu"])
    fake.send_messages(alice.user_id, second, ["in alpha"])
    directory = RoomDirectory()
    connect = engine_connect(
        fake.base_url,
        alice,
        tmp_path / "store",
        passphrase="pw",
        config=EngineConfig(),
        directory=directory,
        kdf_cost=KdfParams.cheap(),
        sync=False,
        transport=fake.transport,
        retry=RetryPolicy(attempts=1),
    )
    app = GaplineApp(connect, rooms=directory, tz=UTC)
    async with app.run_test(size=(80, 24)) as pilot:

        def bodies() -> list[str | None]:
            return [getattr(row.item, "body", None) for row in app.timeline.rows]

        # no room given: the first room of the list (by name) opens
        await until(pilot, lambda: "in alpha" in bodies(), "the first room")
        assert app.room_id == second
        options = app.query_one(OptionList)
        labels = [str(options.get_option_at_index(i).prompt) for i in range(2)]
        assert labels == ["A  alpha", "Z  zulu"]
        await pilot.press("shift+tab")  # from the timeline back to the room list
        await until(pilot, lambda: app.focused is options, "the room list focused")
        await pilot.press("down", "enter")
        await until(pilot, lambda: "in zulu" in bodies(), "the second room")
        assert app.room_id == first
        assert "zulu" in str(app.query_one("#room-title").render())
        assert all(isinstance(row, EventRow) for row in app.timeline.rows)
        await app.shutdown()


def test_row_and_status_wording() -> None:
    assert item_line(message(1), tz=UTC) == "10:54 alice: message 1"
    assert item_line(message(1, edited=True), tz=UTC).endswith("message 1 (edited)")
    assert item_line(message(1, redacted=True, body=None), tz=UTC).endswith(": message deleted")
    assert recent_label(RecentHistoryState.LOADING) == "recent: loading…"
    assert recent_label(RecentHistoryState.failed("boom")) == "recent: failed: boom · r to retry"
    assert RecentHistoryState.CANCELLED.kind is RecentHistoryKind.Cancelled
    assert recent_label(RecentHistoryState.CANCELLED) == "recent: cancelled · r to retry"
