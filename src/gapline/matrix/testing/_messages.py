"""Reading history: ``/messages``, ``/context``, ``/event`` and ``/relations``.

``/messages`` pages by stream position. Backwards, ``end`` is present on the
page holding ``m.room.create`` and absent only on the next, empty page; a
page whose events are all hidden (`HomeserverModel.hide_history_before`)
comes back empty *with* an ``end``, as Synapse's post-fetch visibility filter
does. A member who left reads up to its departure; a stranger gets 403.
"""

from __future__ import annotations

import re
from typing import Any

from ._model import EndpointFamily, StoredEvent
from ._wire import Call, HTTPError, Reply, filter_json, int_param, parse_token, token

__all__ = ["MessagesEndpoints"]

_RELATIONS_TOKEN_RE = re.compile(r"^r(\d+)$")
_RECURSION_DEPTH = 3  # how deep recurse=true follows relations, and what Synapse reports


class MessagesEndpoints(EndpointFamily):
    async def messages(self, call: Call, room_id: str) -> Reply:
        query = call.query
        user_id, device_id, _ = self.model._auth(call.request)
        room, clamp = self.model._reader_room(user_id, room_id)
        direction = query.get("dir", "b")
        if direction not in ("b", "f"):
            raise HTTPError(400, "M_INVALID_PARAM", "dir must be b or f")
        limit = min(int_param(query, "limit", 10), 1000)
        if "from" in query:
            start_token = query["from"]
            position = parse_token(start_token)
        else:
            position = self.model._stream if direction == "b" else 0
            start_token = token(position)
        to_position = parse_token(query["to"]) if "to" in query else None
        if clamp is not None:
            if direction == "b":
                position = min(position, clamp)
            else:
                to_position = clamp if to_position is None else min(to_position, clamp)
        types = _filter_types(query.get("filter"))
        if direction == "b":
            candidates = [e for e in reversed(room.events) if e.stream <= position]
            if to_position is not None:
                candidates = [e for e in candidates if e.stream > to_position]
        else:
            candidates = [e for e in room.events if e.stream > position]
            if to_position is not None:
                candidates = [e for e in candidates if e.stream <= to_position]
        fetched = candidates[:limit]
        limited = len(candidates) > limit
        if not fetched and not limited:
            # The end of history in this direction: Synapse omits `end` only here.
            return Reply(200, {"chunk": [], "start": start_token})
        next_position = fetched[-1].stream - 1 if direction == "b" else fetched[-1].stream
        chunk = [e for e in fetched if room.visible(e) and (types is None or e.type in types)]
        return Reply(
            200,
            {
                "chunk": [self.model._serve(room, e, viewer=(user_id, device_id)) for e in chunk],
                "start": start_token,
                "end": token(next_position),
            },
        )

    async def event(self, call: Call, room_id: str, event_id: str) -> Reply:
        user_id, device_id, _ = self.model._auth(call.request)
        room = self.model._member_room(user_id, room_id)
        event = room.by_id.get(event_id)
        if event is None or not room.visible(event):
            raise HTTPError(404, "M_NOT_FOUND", "Could not find event " + event_id)
        return Reply(200, self.model._serve(room, event, viewer=(user_id, device_id)))

    async def context(self, call: Call, room_id: str, event_id: str) -> Reply:
        user_id, device_id, _ = self.model._auth(call.request)
        viewer = (user_id, device_id)
        room = self.model._member_room(user_id, room_id)
        event = room.by_id.get(event_id)
        if event is None or not room.visible(event):
            raise HTTPError(404, "M_NOT_FOUND", "Event not found.")
        limit = int_param(call.query, "limit", 10)
        index = room.events.index(event)
        before_n, after_n = limit // 2, limit - limit // 2
        before = [e for e in room.events[:index] if room.visible(e)][::-1][:before_n]
        after = room.events[index + 1 : index + 1 + after_n]
        start = token((before[-1].stream if before else event.stream) - 1)
        end = token(after[-1].stream if after else event.stream)
        return Reply(
            200,
            {
                "event": self.model._serve(room, event, viewer=viewer),
                "events_before": [self.model._serve(room, e, viewer=viewer) for e in before],
                "events_after": [self.model._serve(room, e, viewer=viewer) for e in after],
                "start": start,
                "end": end,
                "state": [e.to_json() for e in room.state.values()],
            },
        )

    async def relations(self, call: Call, room_id: str, tail: list[str]) -> Reply:
        """Children by ``m.relates_to.event_id`` (``tail``: event ID [, rel_type [, event type]])."""
        query = call.query
        user_id, device_id, _ = self.model._auth(call.request)
        room = self.model._member_room(user_id, room_id)
        if not tail or len(tail) > 3:
            raise HTTPError(404, "M_UNRECOGNIZED", "Unrecognized request")
        target, rel_filter, type_filter = (
            tail[0],
            (tail[1] if len(tail) > 1 else None),
            (tail[2] if len(tail) > 2 else None),
        )
        root = room.by_id.get(target)
        if root is None or not room.visible(root):
            raise HTTPError(404, "M_NOT_FOUND", "Event not found")
        recurse = query.get("recurse", "false") == "true"
        found: list[StoredEvent] = []
        frontier = {target}
        for _depth in range(_RECURSION_DEPTH if recurse else 1):
            level = []
            for event in room.events:
                parent, rel_type = event.relates_to()
                if parent not in frontier or not room.visible(event):
                    continue
                if rel_filter is not None and rel_type != rel_filter:
                    continue
                if type_filter is not None and event.type != type_filter:
                    continue
                level.append(event)
            found.extend(level)
            frontier = {e.event_id for e in level}
            if not frontier:
                break
        found.sort(key=lambda e: e.stream, reverse=query.get("dir", "b") == "b")
        if "from" in query:
            # Its own next_batch tokens ("r<stream>"), or a /messages or /sync token, as
            # the spec allows ("between positions n and n + 1": n itself is included).
            match = _RELATIONS_TOKEN_RE.match(query["from"])
            if match is not None:
                bound = int(match.group(1))
            else:
                position = parse_token(query["from"])
                bound = position + 1 if query.get("dir", "b") == "b" else position
            if query.get("dir", "b") == "b":
                found = [e for e in found if e.stream < bound]
            else:
                found = [e for e in found if e.stream > bound]
        limit = min(int_param(query, "limit", 5), 1000)
        page = found[:limit]
        viewer = (user_id, device_id)
        out: dict[str, Any] = {"chunk": [self.model._serve(room, e, viewer=viewer) for e in page]}
        if len(found) > limit:
            out["next_batch"] = f"r{page[-1].stream}"
        if "from" in query:
            out["prev_batch"] = query["from"]
        if recurse:
            out["recursion_depth"] = _RECURSION_DEPTH  # whatever depth was reached, as Synapse
        return Reply(200, out)


def _filter_types(raw: str | None) -> set[str] | None:
    types = filter_json(raw).get("types")
    return set(types) if isinstance(types, list) else None
