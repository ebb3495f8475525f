"""Pure classification of Matrix events for the journal: what an event is, its thread,
its visible content, whether it is our own streaming progress, and its sidecar text.

Used by ingress (every timeline event), hydration and the point refetch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from gapline.journal._progress import is_streaming_progress
from gapline.journal._sidecar import SidecarUnresolved, resolve_sidecar, sidecar_ref
from gapline.journal._types import EventKind, InboundEvent, Provenance
from gapline.matrix import ClientEvent

__all__ = [
    "MediaDownloader",
    "classify_kind",
    "inbound_event",
    "is_own_progress",
    "resolve_text",
    "thread_of",
    "visible_content",
]

log = logging.getLogger("gapline.journal.ingress")


def visible_content(event: ClientEvent) -> Mapping[str, Any]:
    """An edit's ``m.new_content``, anything else's ``content``."""
    new = event.content.get("m.new_content")
    if _rel_type(event) == "m.replace" and isinstance(new, Mapping):
        return new
    return event.content


def _rel_type(event: ClientEvent) -> str | None:
    relates = event.content.get("m.relates_to")
    if isinstance(relates, Mapping):
        rel = relates.get("rel_type")
        return rel if isinstance(rel, str) else None
    return None


def thread_of(event: ClientEvent) -> str | None:
    """The thread root an event says it belongs to, or None."""
    relates = event.content.get("m.relates_to")
    if isinstance(relates, Mapping) and relates.get("rel_type") == "m.thread":
        root = relates.get("event_id")
        return root if isinstance(root, str) else None
    return None


def is_own_progress(event: ClientEvent, principal_id: str) -> bool:
    """Contract 4's predicate over a Matrix event (the store's pure function)."""
    return is_streaming_progress(
        principal_id=principal_id,
        sender=event.sender,
        rel_type=_rel_type(event),
        visible_content=visible_content(event),
    )


def classify_kind(event: ClientEvent, principal_id: str, provenance: Provenance) -> EventKind:
    """What the runtime will do with an event.

    Only a new text message from someone else, delivered live or recovered,
    is a turn: history predates us, our own messages are context, and an
    edit revises a message rather than asking anything new.
    """
    if event.type == "m.room.redaction":
        return EventKind.REDACTION
    if event.type == "m.reaction":
        return EventKind.REACTION
    if (
        event.type == "m.room.message"
        and event.state_key is None
        and event.sender != principal_id
        and provenance is not Provenance.HISTORY
        and _rel_type(event) != "m.replace"
        and event.content.get("msgtype") in ("m.text", "m.notice", "m.emote")
        and isinstance(event.content.get("body"), str)
    ):
        return EventKind.ACTIONABLE
    return EventKind.CONTEXT_ONLY


def inbound_event(
    room_id: str,
    event: ClientEvent,
    *,
    kind: EventKind,
    provenance: Provenance,
    resolved_text: str | None = None,
) -> InboundEvent:
    return InboundEvent(
        event_id=event.event_id,
        room_id=room_id,
        thread_id=thread_of(event),
        sender=event.sender,
        origin_server_ts=event.origin_server_ts,
        type=event.type,
        content=msgspec.json.encode(event.content).decode(),
        kind=kind,
        provenance=provenance,
        redacts=event.redacts,
        resolved_text=resolved_text,
    )


class MediaDownloader(Protocol):
    async def download(self, mxc_uri: str) -> bytes: ...


async def resolve_text(event: ClientEvent, media: MediaDownloader | None) -> str | None:
    """The resolved sidecar text of an event that carries one; None when it has none
    or it cannot be resolved (the store then records the refresh debt)."""
    ref = sidecar_ref(visible_content(event))
    if ref is None or media is None:
        return None
    try:
        return await resolve_sidecar(ref, media.download)
    except SidecarUnresolved as exc:
        log.warning("sidecar unresolved", extra={"event_id": event.event_id, "error": str(exc)})
        return None
