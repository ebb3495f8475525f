"""``/sync``: joined, invited and left rooms since a token, and a real long-poll.

The timeline holds the last ``limit`` new events (10, or the filter's
``room.timeline.limit``), ``limited`` when more arrived, and always a
``prev_batch`` that ``/messages`` pages back from; ``state`` holds what changed
in the gap a limited timeline left out. With ``since`` and a ``timeout`` and
nothing new, the answer waits for the model's next stream change.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ._model import EndpointFamily, Room, StoredEvent
from ._wire import Call, Reply, filter_json, int_param, parse_token, sync_token, token

__all__ = ["DEFAULT_TIMELINE_LIMIT", "SyncEndpoints"]

DEFAULT_TIMELINE_LIMIT = 10


class SyncEndpoints(EndpointFamily):
    async def sync(self, call: Call) -> Reply:
        query = call.query
        user_id, device_id, _ = self.model._auth(call.request)
        viewer = (user_id, device_id)
        since = parse_token(query["since"]) if "since" in query else None
        limit = _timeline_limit(query.get("filter"))
        timeout_ms = int_param(query, "timeout", 0)
        full_state = query.get("full_state") == "true"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            wake = self.model._wake
            answer = self._answer(viewer, since, limit, full_state)
            empty = (
                not any(answer["rooms"][k] for k in ("join", "invite", "leave"))
                and not answer["account_data"]["events"]
            )
            remaining = deadline - loop.time()
            if since is None or not empty or remaining <= 0:
                return Reply(200, answer)
            try:
                async with asyncio.timeout(remaining):
                    await wake.wait()
            except TimeoutError:
                return Reply(200, self._answer(viewer, since, limit, full_state))

    def _answer(
        self, viewer: tuple[str, str], since: int | None, limit: int, full_state: bool
    ) -> dict[str, Any]:
        user_id = viewer[0]
        after = since or 0
        rooms: dict[str, dict[str, Any]] = {"join": {}, "invite": {}, "leave": {}}
        for room_id, room in self.model._rooms.items():
            membership = room.membership(user_id)
            member_event = room.state.get(("m.room.member", user_id))
            if membership == "join":
                joined = self._joined_room(room, viewer, since, limit, full_state)
                if joined is not None:
                    rooms["join"][room_id] = joined
            elif (
                membership == "invite" and member_event is not None and member_event.stream > after
            ):
                rooms["invite"][room_id] = _invited_room(room, member_event)
            elif (
                membership in ("leave", "ban")
                and since is not None
                and member_event is not None
                and member_event.stream > after
            ):
                rooms["leave"][room_id] = _left_room(room, viewer, after, limit, member_event)
        account = [
            {"type": t, "content": c}
            for t, (stream, c) in self.model._global_data.get(user_id, {}).items()
            if stream > after
        ]
        return {
            "next_batch": sync_token(self.model._stream),
            "rooms": rooms,
            "account_data": {"events": account},
        }

    def _joined_room(
        self, room: Room, viewer: tuple[str, str], since: int | None, limit: int, full_state: bool
    ) -> dict[str, Any] | None:
        user_id = viewer[0]
        after = since or 0
        new = [e for e in room.events if e.stream > after and room.visible(e)]
        timeline = new[-limit:] if limit else []
        receipts: dict[str, dict[str, dict[str, Any]]] = {}
        for stream, event_id, receipt_type, reader, ts in room.receipts:
            if receipt_type == "m.read.private" and reader != user_id:
                continue  # a private receipt reaches its owner only
            if stream > after:
                receipts.setdefault(event_id, {}).setdefault(receipt_type, {})[reader] = {"ts": ts}
        typing_changed = room.typing_stream > after and (since is not None or bool(room.typing))
        room_data = [
            {"type": t, "content": c}
            for t, (stream, c) in self.model._room_data.get((user_id, room.room_id), {}).items()
            if stream > after
        ]
        if (
            since is not None
            and not new
            and not receipts
            and not room_data
            and not full_state
            and not typing_changed
        ):
            return None
        timeline_start = timeline[0].stream if timeline else self.model._stream + 1
        if since is None or full_state:
            state = [e for e in room.state.values() if e.stream < timeline_start]
        else:
            # State that changed in the gap a limited timeline left out.
            latest: dict[tuple[str, str], StoredEvent] = {}
            for e in room.events:
                if e.state_key is not None and after < e.stream < timeline_start:
                    latest[(e.type, e.state_key)] = e
            state = list(latest.values())
        return {
            "timeline": {
                "events": [
                    self.model._serve(room, e, viewer=viewer, with_room_id=False) for e in timeline
                ],
                "limited": len(new) > len(timeline),
                "prev_batch": token(timeline_start - 1),
            },
            "state": {"events": [e.to_json(with_room_id=False) for e in state]},
            "ephemeral": {
                "events": ([{"type": "m.receipt", "content": receipts}] if receipts else [])
                + (
                    [{"type": "m.typing", "content": {"user_ids": sorted(room.typing)}}]
                    if typing_changed
                    else []
                )
            },
            "account_data": {"events": room_data},
            "unread_notifications": _unread(room, user_id, self.model._profiles.get(user_id)),
        }


def _unread(room: Room, user_id: str, display_name: str | None) -> dict[str, int]:
    """Messages from others after the user's newest read receipt (edits and reactions do
    not notify); highlights are those naming the user, as Synapse's default push rules."""
    read = 0
    for _stream, event_id, receipt_type, reader, _ts in room.receipts:
        target = room.by_id.get(event_id)
        if reader == user_id and receipt_type in ("m.read", "m.read.private") and target:
            read = max(read, target.stream)
    mine = room.state.get(("m.room.member", user_id))
    joined_at = mine.stream if mine is not None else 0
    notes = highlights = 0
    names = [user_id.split(":")[0].lstrip("@")] + ([display_name] if display_name else [])
    for event in room.events:
        if event.stream <= max(read, joined_at) or event.sender == user_id:
            continue
        if event.type != "m.room.message" or event.relates_to()[1] == "m.replace":
            continue
        notes += 1
        body = event.content.get("body")
        if isinstance(body, str) and any(n.lower() in body.lower() for n in names):
            highlights += 1
    return {"highlight_count": highlights, "notification_count": notes}


def _invited_room(room: Room, member_event: StoredEvent) -> dict[str, Any]:
    """The stripped state an invitee sees: create, name, join rules and its invite."""
    stripped = [
        {
            "type": e.type,
            "state_key": e.state_key,
            "sender": e.sender,
            "content": e.content,
        }
        for e in room.state.values()
        if e.type in ("m.room.create", "m.room.name", "m.room.join_rules") or e is member_event
    ]
    return {"invite_state": {"events": stripped}}


def _left_room(
    room: Room, viewer: tuple[str, str], after: int, limit: int, member_event: StoredEvent
) -> dict[str, Any]:
    """A departed room: the timeline up to and including the departure."""
    events = [e for e in room.events if after < e.stream <= member_event.stream and room.visible(e)]
    tail = events[-limit:] if limit else []
    return {
        "timeline": {
            "events": [e.to_json(with_room_id=False, viewer=viewer) for e in tail],
            "limited": len(events) > len(tail),
            "prev_batch": token((tail[0].stream if tail else member_event.stream) - 1),
        },
        "state": {"events": []},
        "account_data": {"events": []},
    }


def _timeline_limit(raw: str | None) -> int:
    timeline = filter_json(raw).get("room", {}).get("timeline", {})
    limit = (
        timeline.get("limit", DEFAULT_TIMELINE_LIMIT)
        if isinstance(timeline, dict)
        else DEFAULT_TIMELINE_LIMIT
    )
    return int(limit)
