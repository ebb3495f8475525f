"""Relations and their targets admitted in one batch (as a page of a fill brings them):
each row is rendered from its aggregate as the whole batch leaves it, and a server's
bundled aggregation repeating what the batch or the cache holds already changes nothing.

Written through the store directly, so the batch is exactly the events listed.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gapline.history._updates import RowChanged
from gapline.matrix import ClientEvent
from tests.history.cache_contract import ROOM, open_cache, write
from tests.history.relations_support import edit_of, thread_reply

B = "@b:x"


def event(event_id: str, ts: int, content: dict[str, Any], **fields: Any) -> ClientEvent:
    return ClientEvent(
        event_id=event_id,
        type=fields.pop("type", "m.room.message"),
        sender=B,
        origin_server_ts=ts,
        content=content,
        **fields,
    )


def text(event_id: str, ts: int, body: str, **fields: Any) -> ClientEvent:
    return event(event_id, ts, {"msgtype": "m.text", "body": body}, **fields)


def bundled(**relations: Any) -> dict[str, Any]:
    return {"m.relations": relations}


async def window_rows(store: Any) -> dict[str, Any]:
    window = await store.load_window(ROOM, 50)
    assert window.items is not None
    return {i.event_id: i for i in window.items if hasattr(i, "event_id")}


async def test_a_target_touched_by_an_edit_a_reaction_and_a_reply_shows_all_three(tmp_path):
    store = await open_cache(str(tmp_path / "history.sqlite3"))
    target = text("$t", 1, "v0")
    edit = event("$e", 2, edit_of("$t", "v1"))
    reaction = event(
        "$r", 3, {"m.relates_to": {"rel_type": "m.annotation", "event_id": "$t", "key": "+"}},
        type="m.reaction",
    )  # fmt: skip
    reply = event("$th", 4, thread_reply("$t", "in thread"))
    batch = [target, edit, reaction, reply]
    await write(store, lambda s: s.ingest_sync(batch, limited=True, prev_batch="p"))
    row = (await window_rows(store))["$t"]
    assert (row.body, row.edited) == ("v1", True)
    assert [(r.key, r.senders) for r in row.reactions] == [("+", (B,))]
    assert row.thread_summary is not None and row.thread_summary.count == 1
    assert row.thread_summary.latest is not None
    assert row.thread_summary.latest.body == "in thread"
    await store.backend.close()


async def test_an_edit_of_a_thread_reply_in_the_same_batch_shows_in_the_roots_summary(tmp_path):
    store = await open_cache(str(tmp_path / "history.sqlite3"))
    root = text("$root", 1, "root")
    reply = event("$th", 2, thread_reply("$root", "first words"))
    edit = event("$e", 3, edit_of("$th", "second words"))
    batch = [root, reply, edit]
    await write(store, lambda s: s.ingest_sync(batch, limited=True, prev_batch="p"))
    summary = (await window_rows(store))["$root"].thread_summary
    assert summary is not None and summary.latest is not None
    assert summary.latest.body == "second words"
    await store.backend.close()


async def test_a_bundled_edit_arriving_with_its_edit_event_is_held_once_as_an_event(tmp_path):
    """The server bundled the same edit the batch brings as an event: it is held once,
    not as a bundle (whose revisions may hide older ones), so its redaction shows the
    original again rather than an edited row with nothing to show."""
    store = await open_cache(str(tmp_path / "history.sqlite3"))
    edit = event("$e", 2, edit_of("$t", "v1"))
    target = text("$t", 1, "v0", unsigned=bundled(**{"m.replace": msgspec.to_builtins(edit)}))
    await write(store, lambda s: s.ingest_sync([target, edit], limited=True, prev_batch="p"))
    held = await store.aggregate(ROOM, "$t")
    assert held is not None and [r.event_id for r in held.edits] == ["$e"]
    assert held.unknown_before is None
    assert (await window_rows(store))["$t"].body == "v1"
    redaction = event("$x", 5, {"redacts": "$e"}, type="m.room.redaction")
    _, updates = await write(
        store, lambda s: s.ingest_sync([redaction], limited=False, prev_batch=None)
    )
    [changed] = [u for u in updates if isinstance(u, RowChanged) and u.item.event_id == "$t"]
    assert (changed.item.body, changed.item.edited, changed.item.redacted) == ("v0", False, False)
    await store.backend.close()


async def test_a_bundled_edit_held_from_an_earlier_batch_changes_nothing(tmp_path):
    """The edit came first (its target still unknown); the target arrives later with the
    same edit bundled: one revision held, still withdrawn by the edit's redaction."""
    store = await open_cache(str(tmp_path / "history.sqlite3"))
    edit = event("$e", 2, edit_of("$t", "v1"))
    await write(store, lambda s: s.ingest_sync([edit], limited=True, prev_batch="p"))
    target = text("$t", 1, "v0", unsigned=bundled(**{"m.replace": msgspec.to_builtins(edit)}))
    await write(store, lambda s: s.ingest_sync([target], limited=True, prev_batch="q"))
    held = await store.aggregate(ROOM, "$t")
    assert held is not None and [r.event_id for r in held.edits] == ["$e"]
    assert held.unknown_before is None
    assert (await window_rows(store))["$t"].body == "v1"
    await store.backend.close()


async def test_a_bundled_newest_reply_the_batch_holds_keeps_the_batchs_copy(tmp_path):
    """The root's bundled summary names the reply the batch brings: the count is the
    server's, the newest reply the one the batch rendered (with its sender's name)."""
    store = await open_cache(str(tmp_path / "history.sqlite3"))
    reply = event("$th", 2, thread_reply("$root", "in thread"))
    summary = {"count": 5, "latest_event": msgspec.to_builtins(reply)}
    root = text("$root", 1, "root", unsigned=bundled(**{"m.thread": summary}))
    await write(store, lambda s: s.ingest_sync([root, reply], limited=True, prev_batch="p"))
    shown = (await window_rows(store))["$root"].thread_summary
    assert shown is not None and shown.count == 5
    assert shown.latest is not None and (shown.latest.event_id, shown.latest.body) == (
        "$th",
        "in thread",
    )
    held = await store.aggregate(ROOM, "$root")
    assert held is not None and held.thread is not None and held.thread.count == 1
    await store.backend.close()


async def test_a_bundle_is_taken_into_the_aggregate_and_not_stored_with_its_event(tmp_path):
    """The server's bundle repeats whole events: once the rules took it, the event is
    stored without it (other ``unsigned`` keys stay), and the row still shows what it said,
    after the store is opened again too."""
    path = str(tmp_path / "history.sqlite3")
    store = await open_cache(path)
    edit = event("$e", 2, edit_of("$t", "v1"))
    unsigned = {"age": 7, **bundled(**{"m.replace": msgspec.to_builtins(edit)})}
    target = text("$t", 1, "v0", unsigned=unsigned)
    await write(store, lambda s: s.ingest_sync([target], limited=True, prev_batch="p"))
    [stored] = await store.all_events(ROOM)
    assert stored.event.unsigned == {"age": 7}
    assert stored.event.content == target.content
    await store.backend.close()
    store = await open_cache(path)
    row = (await window_rows(store))["$t"]
    assert (row.body, row.edited) == ("v1", True)
    await store.backend.close()
