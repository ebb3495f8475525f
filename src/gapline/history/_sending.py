"""Commands that write to a room: messages (replies, thread replies), reactions, redactions,
edits, read markers, typing.

Messages, reactions, edits and redactions go through the durable send queue
(``_send_queue``): each answers ``Ok`` once it is committed there (a message's
local echo row, ``Pending``, published), and never waits on the homeserver;
what a reaction, edit or redaction does arrives with the sync. Read markers and
typing answer ``Ok`` once the homeserver accepted the request; what they cause
(the message, the edit applied to its row, the reaction chip) arrives with
the sync like anyone else's event, through the same relation rules. Only
``MarkRead`` also moves the marker and this account's receipt at once (the
server's echo then changes nothing). A homeserver's refusal answers
``Failed`` with a readable line; a command about an event the cache cannot
vouch for answers ``EventNotFound`` or ``Invalid``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gapline.history._cache_store import CacheStore
from gapline.history._commits import Commits
from gapline.history._failures import describe
from gapline.history._markdown import HTML_FORMAT, formatted_body
from gapline.history._relations import RelKind, is_redacted, relation_of
from gapline.history._send_queue import SendQueue
from gapline.history._types import (
    Answer,
    EditMessage,
    EventNotFound,
    Failed,
    Invalid,
    MarkRead,
    Ok,
    RedactEvent,
    SendMessage,
    SendReaction,
    SetTyping,
)
from gapline.history._walks import OFFLINE
from gapline.matrix import MatrixClient, MatrixError

__all__ = ["Sending"]


class Sending:
    """The writing commands of open rooms (the engine checks the room is open)."""

    def __init__(
        self,
        store: CacheStore,
        client: MatrixClient | None,
        commits: Commits,
        flush: Callable[[str], Awaitable[None]],
        queue: SendQueue,
    ) -> None:
        self._store = store
        self._client = client
        self._commits = commits
        self._flush = flush
        self._queue = queue

    async def _call(self, call: Callable[[MatrixClient], Awaitable[Any]]) -> Answer:
        if self._client is None:
            return Failed(OFFLINE)
        try:
            await call(self._client)
        except MatrixError as exc:
            return Failed(describe(exc))
        return Ok()

    async def message(self, command: SendMessage) -> Answer:
        content: dict[str, Any] = {"msgtype": command.msgtype, "body": command.body}
        html = formatted_body(command.body) if command.markdown else None
        if html is not None:
            content["format"] = HTML_FORMAT
            content["formatted_body"] = html
        reply, root = command.in_reply_to, command.thread_root
        if root is not None:
            # A thread reply quotes the thread's newest event unless it answers one in
            # particular: clients without threads then show it as a reply to that.
            latest = root
            aggregate = await self._store.aggregate(command.room_id, root)
            if aggregate is not None and aggregate.thread and aggregate.thread.latest:
                latest = aggregate.thread.latest.event_id
            content["m.relates_to"] = {
                "rel_type": "m.thread",
                "event_id": root,
                "is_falling_back": reply is None,
                "m.in_reply_to": {"event_id": reply or latest},
            }
        elif reply is not None:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply}}
        if self._client is None:
            return Failed(OFFLINE)
        return await self._queue.enqueue(
            command.room_id, "m.room.message", content, thread_root=root
        )

    async def reaction(self, command: SendReaction) -> Answer:
        """Add the reaction, or take this account's reaction with that key back."""
        if self._client is None:
            return Failed(OFFLINE)
        me = self._client.user_id
        aggregate = await self._store.aggregate(command.room_id, command.event_id)
        mine = [
            a.event_id
            for a in (aggregate.annotations if aggregate is not None else ())
            if a.key == command.key and a.sender == me
        ]
        for event_id in mine:
            answer = await self._queue.enqueue(
                command.room_id, "m.room.redaction", {}, redacts=event_id
            )
            if not isinstance(answer, Ok):
                return answer
        if mine:
            return Ok()
        content = {
            "m.relates_to": {
                "rel_type": "m.annotation",
                "event_id": command.event_id,
                "key": command.key,
            }
        }
        return await self._queue.enqueue(command.room_id, "m.reaction", content)

    async def redact(self, command: RedactEvent) -> Answer:
        if self._client is None:
            return Failed(OFFLINE)
        content = {} if command.reason is None else {"reason": command.reason}
        return await self._queue.enqueue(
            command.room_id, "m.room.redaction", content, redacts=command.event_id
        )

    async def edit(self, command: EditMessage) -> Answer:
        stored = await self._store.event(command.room_id, command.event_id)
        if stored is None:
            return EventNotFound()
        original = stored.event
        me = self._client.user_id if self._client is not None else None
        if original.sender != me:
            return Invalid("only your own messages can be edited")
        relation = relation_of(original)
        if (
            original.state_key is not None
            or is_redacted(original)
            or (relation is not None and relation.kind is not RelKind.THREAD)
        ):
            return Invalid(
                "only a message can be edited (not an edit, a reaction or a state event)"
            )
        msgtype = original.content.get("msgtype")
        new: dict[str, Any] = {
            "msgtype": msgtype if isinstance(msgtype, str) else "m.text",
            "body": command.body,
        }
        html = formatted_body(command.body) if command.markdown else None
        if html is not None:
            new["format"] = HTML_FORMAT
            new["formatted_body"] = html
        content = {
            **new,
            "body": "* " + command.body,
            "m.new_content": new,
            "m.relates_to": {"rel_type": "m.replace", "event_id": command.event_id},
        }
        if html is not None:
            content["formatted_body"] = "* " + html
        return await self._queue.enqueue(command.room_id, original.type, content)

    async def mark_read(self, command: MarkRead) -> Answer:
        room_id, event_id = command.room_id, command.event_id
        answer = await self._call(
            lambda c: c.set_read_markers(
                room_id,
                fully_read=event_id,
                read=None if command.private else event_id,
                read_private=event_id if command.private else None,
            )
        )
        me = self._client.user_id if self._client is not None else None
        if isinstance(answer, Ok) and me is not None:
            await self._commits.room_write(room_id, lambda s: s.mark_read(me, event_id))
            await self._flush(room_id)
        return answer

    async def typing(self, command: SetTyping) -> Answer:
        return await self._call(lambda c: c.set_typing(command.room_id, typing=command.typing))
