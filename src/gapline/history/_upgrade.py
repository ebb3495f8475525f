"""Work a migration leaves for the engine: classifying events retained before the rules.

A store written before the relation rules existed holds every edit, reaction,
redaction and thread reply as a row of its own, and no aggregates. Migration 2
marks such a store (``history_upgrade``); the first engine to open it passes
every retained event, room by room and oldest first, through the same rules
new events pass (``Sections.reclassify``), in chunks of :data:`CHUNK` events,
each chunk its own transaction. Relation events take effect once (the relation
index remembers them), so a run that was interrupted simply runs again; the
mark is removed only when every room is done.
"""

from __future__ import annotations

import logging

from gapline.history._cache_store import CacheStore, split_timeline_key
from gapline.history._sections import Sections
from gapline.history._updates import Key
from gapline.storage import Tx

__all__ = ["CHUNK", "finish_upgrades"]

log = logging.getLogger("gapline.history")

CHUNK = 2000


async def finish_upgrades(store: CacheStore) -> int:
    """Do what migrations left to do; returns how many events were classified."""
    backend = store.backend
    pending = await backend.read(
        lambda tx: tx.one("SELECT step FROM history_upgrade WHERE step = 'relations'")
    )
    if pending is None:
        return 0
    rooms = await backend.read(store.room_ids)
    total = 0
    for name in rooms:
        room_id, root = split_timeline_key(name)
        if root is not None:
            continue  # thread timelines are newer than the rules
        after: Key | None = None
        while True:

            def op(tx: Tx, after: Key | None = after, room_id: str = room_id) -> tuple[Key, int]:
                sections = Sections(store, tx, room_id)
                chunk = store.events_after(tx, sections.room, after, CHUNK)
                sections.reclassify(chunk)
                return (chunk[-1].key if chunk else (0, 0)), len(chunk)

            last, count = await backend.write(op)
            total += count
            if count < CHUNK:
                break
            after = last
    await backend.write(
        lambda tx: tx.execute("DELETE FROM history_upgrade WHERE step = 'relations'")
    )
    log.info("classified the events of %d rooms retained before the relation rules", len(rooms))
    return total
