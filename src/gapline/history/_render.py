"""An event row from what the cache holds: the event, its aggregate, its sender's name.

:func:`render` is the one place an :class:`EventItem` is made (without its
receipts, which the timeline adds). The cache calls it where events enter and
where they are read back, so a row published as a diff and a row loaded on a
later open are the same value. What it decides:

- the body is the visible revision's (:func:`~gapline.history._aggregates.visible_revision`),
  with a rich reply's fallback stripped; ``edited`` exactly when a valid
  replacement applied;
- a redacted event (by the server, or by a tombstone the cache holds) shows no
  content and no reactions; a redacted replacement falls back to the previous
  revision the cache holds, or shows ``edited`` and ``redacted`` with no body;
- a state event's body says what changed, in words;
- reactions are grouped by key, earliest first; a thread root carries its
  summary (the server's bundled count is a floor for the cache's own).
"""

from __future__ import annotations

from typing import Any

from gapline.history._aggregates import Aggregate, ThreadReply, visible_revision
from gapline.history._decryption import decryption_of
from gapline.history._items import (
    EventItem,
    InReplyTo,
    Reaction,
    ReplyStatus,
    ThreadLatest,
    ThreadSummary,
)
from gapline.history._markdown import HTML_FORMAT
from gapline.history._relations import is_redacted, reply_target, strip_reply_fallback
from gapline.matrix import ClientEvent

__all__ = [
    "first_line",
    "formatting_of",
    "preview_of",
    "render",
    "reply_preview",
    "state_words",
    "text_of",
]


def first_line(text: str | None, limit: int = 120) -> str | None:
    if text is None:
        return None
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _quoted(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _membership_words(event: ClientEvent) -> str | None:
    content, prev = event.content, event.unsigned.get("prev_content")
    prev = prev if isinstance(prev, dict) else {}
    now, before = content.get("membership"), prev.get("membership")
    target = event.state_key or ""
    who = _quoted(content.get("displayname")) or target
    self_change = event.sender == target
    match now:
        case "join" if before == "join":
            old, new = _quoted(prev.get("displayname")), _quoted(content.get("displayname"))
            if old != new:
                if new is None:
                    return "removed their display name"
                return f"changed their name to {new}" if old else f"set their name to {new}"
            if prev.get("avatar_url") != content.get("avatar_url"):
                return "changed their avatar"
            return "updated their profile"
        case "join":
            return "joined the room"
        case "invite":
            return f"invited {who}"
        case "leave" if self_change:
            return "rejected the invitation" if before == "invite" else "left the room"
        case "leave":
            if before == "invite":
                return f"withdrew the invitation of {target}"
            if before == "ban":
                return f"unbanned {target}"
            return f"removed {target}" + _reason(content)
        case "ban":
            return f"banned {target}" + _reason(content)
        case "knock":
            return "asked to join"
    return None


def _reason(content: dict[str, Any]) -> str:
    reason = _quoted(content.get("reason"))
    return f": {reason}" if reason else ""


def state_words(event: ClientEvent) -> str | None:
    """What a state event changed, in words (``None`` for one it does not know)."""
    content = event.content
    match event.type:
        case "m.room.member":
            return _membership_words(event)
        case "m.room.create":
            return "created the room"
        case "m.room.name":
            name = _quoted(content.get("name"))
            return f"renamed the room to “{name}”" if name else "removed the room name"
        case "m.room.topic":
            topic = _quoted(content.get("topic"))
            return f"changed the topic to “{topic}”" if topic else "removed the topic"
        case "m.room.avatar":
            return "changed the room avatar"
        case "m.room.power_levels":
            return "changed the power levels"
        case "m.room.join_rules":
            rule = _quoted(content.get("join_rule"))
            return f"set the join rule to {rule}" if rule else None
        case "m.room.history_visibility":
            seen = _quoted(content.get("history_visibility"))
            return f"made future history visible to {seen}" if seen else None
        case "m.room.guest_access":
            access = _quoted(content.get("guest_access"))
            return f"set guest access to {access}" if access else None
        case "m.room.encryption":
            return "turned on end-to-end encryption"
        case "m.room.canonical_alias":
            alias = _quoted(content.get("alias"))
            return f"set the room's address to {alias}" if alias else "removed the room's address"
        case "m.room.pinned_events":
            return "changed the pinned messages"
        case "m.room.server_acl":
            return "changed the server access list"
        case "m.room.tombstone":
            return "upgraded this room"
    return None


def text_of(event: ClientEvent, content: dict[str, Any]) -> str | None:
    body = content.get("body")
    if not isinstance(body, str):
        return None
    if "m.relates_to" not in event.content or not body.startswith("> "):
        return body
    return strip_reply_fallback(body) if reply_target(event) is not None else body


def formatting_of(content: dict[str, Any]) -> tuple[str | None, str | None]:
    """A message content's ``msgtype`` and its HTML ``formatted_body`` (``None`` each when
    absent, or the body is in another format)."""
    msgtype = content.get("msgtype")
    html = content.get("formatted_body")
    if content.get("format") != HTML_FORMAT or not isinstance(html, str):
        html = None
    return (msgtype if isinstance(msgtype, str) and msgtype else None), html


def _reactions(aggregate: Aggregate) -> tuple[Reaction, ...]:
    by_key: dict[str, list[str]] = {}
    for annotation in aggregate.annotations:
        senders = by_key.setdefault(annotation.key, [])
        if annotation.sender not in senders:
            senders.append(annotation.sender)
    return tuple(Reaction(key, tuple(senders)) for key, senders in by_key.items())


def _thread(aggregate: Aggregate, root_sender: str, me: str | None) -> ThreadSummary | None:
    thread = aggregate.thread
    if thread is None:
        return None
    count = max(thread.count, thread.bundled_count)
    if count == 0 and thread.latest is None:
        return None
    latest = thread.latest
    participated = thread.bundled_participated or (
        me is not None and (me == root_sender or me in thread.participants)
    )
    return ThreadSummary(
        count=count,
        latest=None
        if latest is None
        else ThreadLatest(
            event_id=latest.event_id,
            sender=latest.sender,
            sender_name=latest.sender_name,
            body=None if latest.redacted else latest.body,
            redacted=latest.redacted,
        ),
        participated=participated,
    )


def render(
    event: ClientEvent,
    aggregate: Aggregate | None,
    *,
    sender_name: str | None = None,
    reply: InReplyTo | None = None,
    me: str | None = None,
) -> EventItem:
    """The row of ``event`` as the cache holds it now (receipts are the timeline's)."""
    redacted = is_redacted(event) or (aggregate is not None and aggregate.redacted_by is not None)
    edited = False
    body: str | None = None
    content: dict[str, Any] | None = None
    if redacted:
        pass
    elif event.state_key is not None:
        body = state_words(event)
    elif aggregate is None:
        content = event.content  # most rows: nothing relates to them
    else:
        visible = visible_revision(aggregate, event.sender, event.type)
        if visible.lost:
            edited, redacted = True, True
        elif visible.revision is not None:
            edited = True
            content = visible.revision.content
        else:
            content = event.content
    msgtype, html = None, None
    if content is not None:
        body = text_of(event, content)
        msgtype, html = formatting_of(content)
    encrypted, undecrypted = decryption_of(event)
    if aggregate is None and not (redacted or edited or encrypted or reply or html):
        # Most rows: the defaults left out, as a Struct takes each keyword it is given at
        # a cost (the full call below is five times this one, on every row of a page).
        return EventItem(
            id=event.event_id,
            event_id=event.event_id,
            sender=event.sender,
            origin_server_ts=event.origin_server_ts,
            event_type=event.type,
            body=body,
            sender_name=sender_name,
            msgtype=msgtype,
        )
    return EventItem(
        id=event.event_id,
        event_id=event.event_id,
        sender=event.sender,
        origin_server_ts=event.origin_server_ts,
        event_type=event.type,
        body=body,
        edited=edited,
        redacted=redacted,
        sender_name=sender_name,
        in_reply_to=None if redacted else reply,
        reactions=() if redacted or aggregate is None else _reactions(aggregate),
        thread_summary=None if aggregate is None else _thread(aggregate, event.sender, me),
        encrypted=encrypted,
        decryption=None if redacted else undecrypted,
        msgtype=msgtype,
        formatted_body=html,
    )


def preview_of(item: EventItem) -> InReplyTo:
    """How a reply quotes ``item``: its sender and first line (nothing of a redacted one)."""
    return InReplyTo(
        event_id=item.event_id,
        status=ReplyStatus.Ready,
        sender=item.sender,
        sender_name=item.sender_name,
        body=None if item.redacted else first_line(item.body),
        redacted=item.redacted,
    )


def reply_preview(event_id: str, target: EventItem | None, *, unavailable: bool) -> InReplyTo:
    """The quote of ``event_id``: ready from ``target``, unavailable, or still pending."""
    if target is not None:
        return preview_of(target)
    status = ReplyStatus.Unavailable if unavailable else ReplyStatus.Pending
    return InReplyTo(event_id=event_id, status=status)


def thread_reply(item: EventItem) -> ThreadReply:
    """A thread reply as its root's summary keeps it."""
    return ThreadReply(
        event_id=item.event_id,
        sender=item.sender,
        ts=item.origin_server_ts,
        sender_name=item.sender_name,
        body=None if item.redacted else first_line(item.body),
        redacted=item.redacted,
    )
