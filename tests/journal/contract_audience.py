"""The encrypted rooms' audience (who gets the bot's room key), on every backend.

``AudienceContract`` is subclassed with a backend mixin in ``test_sqlite.py`` and
``test_postgres.py``: the same sync answers, written through ``record_audience`` in the
transaction of their sync token, leave the same stored audience on SQLite and
PostgreSQL (there is one SQL text: no fast path needs a PostgreSQL twin).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gapline.journal import JournalStore
from gapline.journal._audience import (
    RoomMembers,
    audience_changes,
    load_audience,
    record_audience,
    store_audience,
)
from gapline.matrix import SyncResponse
from gapline.storage import Backend

BOT = "@bot:example.org"
OTHER_BOT = "@other:example.org"
ROOM = "!room:example.org"


def member(user: str, membership: str, *, prev: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event_id": f"${user}-{membership}",
        "type": "m.room.member",
        "sender": user,
        "origin_server_ts": 1,
        "state_key": user,
        "content": {"membership": membership},
    }
    if prev is not None:
        event["unsigned"] = {"prev_content": {"membership": prev}}
    return event


def visibility(value: str) -> dict[str, Any]:
    return {
        "event_id": f"$hv-{value}",
        "type": "m.room.history_visibility",
        "sender": "@alice:example.org",
        "origin_server_ts": 1,
        "state_key": "",
        "content": {"history_visibility": value},
    }


def sync(
    state: list[dict[str, Any]] = [],  # noqa: B006 - never mutated
    timeline: list[dict[str, Any]] = [],  # noqa: B006
    *,
    left: bool = False,
) -> SyncResponse:
    room = {"state": {"events": state}, "timeline": {"events": timeline}}
    rooms: dict[str, Any] = {"leave": {ROOM: room}} if left else {"join": {ROOM: room}}
    return msgspec.convert({"next_batch": "s1", "rooms": rooms}, SyncResponse)


class AudienceContract:
    @pytest.fixture
    async def store(self, journal_backend: Backend) -> JournalStore:
        return await JournalStore.open(journal_backend)

    @staticmethod
    async def step(
        backend: Backend, response: SyncResponse, *, initial: bool = False, p: str = BOT
    ) -> RoomMembers | None:
        changes = audience_changes(response, principal_id=p, initial=initial)
        await backend.write(lambda tx: record_audience(tx, p, changes))
        return await backend.read(lambda tx: load_audience(tx, p, ROOM))

    async def test_a_first_syncs_state_is_the_whole_audience(self, store: JournalStore) -> None:
        got = await self.step(
            store.backend,
            sync(
                [
                    member(BOT, "join"),
                    member("@alice:example.org", "join"),
                    member("@carol:example.org", "invite"),
                    member("@dave:example.org", "leave"),
                    visibility("invited"),
                ]
            ),
            initial=True,
        )
        assert got == RoomMembers(("@alice:example.org", BOT), ("@carol:example.org",), "invited")

    async def test_incremental_syncs_keep_a_known_audience_current(
        self, store: JournalStore
    ) -> None:
        backend = store.backend
        await self.step(backend, sync([member(BOT, "join")]), initial=True)
        got = await self.step(
            backend,
            sync(
                [member("@carol:example.org", "invite")],
                [
                    member("@alice:example.org", "join"),
                    member("@carol:example.org", "join", prev="invite"),
                    member("@erin:example.org", "invite"),
                    visibility("joined"),
                ],
            ),
        )
        assert got == RoomMembers(
            ("@alice:example.org", BOT, "@carol:example.org"), ("@erin:example.org",), "joined"
        )
        got = await self.step(
            backend,
            sync(
                [],
                [
                    member("@erin:example.org", "leave", prev="invite"),
                    member("@alice:example.org", "ban"),
                ],
            ),
        )
        assert got == RoomMembers((BOT, "@carol:example.org"), (), "joined")

    async def test_no_history_visibility_is_shared(self, store: JournalStore) -> None:
        got = await self.step(store.backend, sync([member(BOT, "join")]), initial=True)
        assert got is not None and got.history_visibility == "shared"

    async def test_an_unknown_room_stays_unknown_until_its_whole_state_comes(
        self, store: JournalStore
    ) -> None:
        backend = store.backend
        # Incremental changes alone cannot say who else is there: nothing is known.
        assert await self.step(backend, sync([], [member("@carol:example.org", "invite")])) is None
        # Our own new join's sync carries the room's whole state.
        joined = sync([member("@alice:example.org", "join")], [member(BOT, "join", prev="invite")])
        got = await self.step(backend, joined)
        assert got == RoomMembers(("@alice:example.org", BOT), (), "shared")
        # Or the homeserver's /state answer, stored once.
        await backend.write(
            lambda tx: store_audience(
                tx, BOT, ROOM, RoomMembers(("@zed:example.org",), (), "invited")
            )
        )
        assert await backend.read(lambda tx: load_audience(tx, BOT, ROOM)) == RoomMembers(
            ("@zed:example.org",), (), "invited"
        )

    async def test_our_departure_forgets_the_room(self, store: JournalStore) -> None:
        backend = store.backend
        await self.step(backend, sync([member(BOT, "join"), member("@a:x", "join")]), initial=True)
        assert await self.step(backend, sync([], [member(BOT, "leave", prev="join")])) is None
        await self.step(backend, sync([member(BOT, "join"), member("@a:x", "join")]), initial=True)
        assert await self.step(backend, sync(left=True)) is None
        # A rejoin brings the whole state again.
        rejoined = sync([member("@b:x", "join")], [member(BOT, "join", prev="leave")])
        assert await self.step(backend, rejoined) == RoomMembers(("@b:x", BOT), (), "shared")

    async def test_each_principal_has_its_own_audience(self, store: JournalStore) -> None:
        backend = store.backend
        await self.step(backend, sync([member(BOT, "join")]), initial=True)
        assert await backend.read(lambda tx: load_audience(tx, OTHER_BOT, ROOM)) is None
        await self.step(
            backend, sync([member(OTHER_BOT, "join"), member("@a:x", "join")]), initial=True,
            p=OTHER_BOT,
        )  # fmt: skip
        assert await backend.read(lambda tx: load_audience(tx, BOT, ROOM)) == RoomMembers(
            (BOT,), (), "shared"
        )
