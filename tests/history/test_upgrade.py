"""A store written before the relation rules: opening it classifies what it retained."""

from __future__ import annotations

from pathlib import Path

import msgspec

from gapline.history import EventItem, OpenRoom
from gapline.history._cache_schema import HISTORY_MIGRATIONS
from gapline.history._cache_store import CacheStore
from gapline.matrix import ClientEvent
from gapline.storage import KdfParams, open_backend, open_cipher
from tests.history.test_engine_support import PASSPHRASE, open_engine

ROOM = "!old:example.org"


def event(n: int, event_type: str, content: dict) -> ClientEvent:
    return ClientEvent(
        event_id=f"$o{n}", type=event_type, sender="@b:example.org",
        origin_server_ts=n, content=content,
    )  # fmt: skip


async def test_an_old_store_is_classified_once_when_it_opens(tmp_path: Path) -> None:
    backend = await open_backend(str(tmp_path / "history.sqlite3"))
    cipher = await open_cipher(backend, PASSPHRASE, kdf_cost=KdfParams.cheap())
    await backend.migrate("history", HISTORY_MIGRATIONS[:1])  # as gapline wrote it before
    old = [
        event(1, "m.room.message", {"msgtype": "m.text", "body": "draft"}),
        event(2, "m.room.message", {
            "msgtype": "m.text", "body": "* final", "m.new_content": {"body": "final"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": "$o1"},
        }),
        event(3, "m.reaction", {"m.relates_to": {
            "rel_type": "m.annotation", "event_id": "$o1", "key": "👍"}}),
        event(4, "m.room.message", {"msgtype": "m.text", "body": "secret"}),
        event(5, "m.room.redaction", {"redacts": "$o4"}),
    ]  # fmt: skip
    store = CacheStore(backend, cipher)

    def write_v1(tx) -> None:
        room = store.note_room(tx, ROOM)
        for pos, e in enumerate(old):
            key = store.event_key(e.event_id)
            body = cipher.encrypt(msgspec.json.encode(e), room.key + key)
            tx.execute(
                "INSERT INTO history_event (room, ord, pos, event, body) VALUES (?, 0, ?, ?, ?)",
                (room.rid, pos, key, body),
            )

    await backend.write(write_v1)
    async with open_engine(backend, None) as h:
        await h.engine.execute(OpenRoom(ROOM))
        items = [i for i in h.engine.timeline(ROOM).state.items if isinstance(i, EventItem)]
        assert len(items) == len(h.engine.timeline(ROOM).state.items)  # no gap, no marker
        assert [(i.event_id, i.body, i.edited, i.redacted) for i in items] == [
            ("$o1", "final", True, False),
            ("$o4", None, False, True),
        ]
        assert [r.key for r in items[0].reactions] == ["👍"]
        stored = await h.engine.store.event(ROOM, "$o4")
        assert stored is not None and stored.event.content == {}
    pending = await backend.read(lambda tx: tx.all("SELECT step FROM history_upgrade"))
    assert pending == []  # done once
    await backend.close()
