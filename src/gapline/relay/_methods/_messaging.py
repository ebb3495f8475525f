"""``message.send``, ``message.delivery.status`` and ``message.timeline.sync``.

A send to another account passes receiving rule 4 before it is accepted: the protocol
library decides (``authorize_delivery``) on the recipient's current devices and profile.
With a ``ContactGrant`` or ``ContactInvite`` the material must be valid; without one the
recipient's published profile must allow public discovery; invalid material is refused,
never treated as a public send. Like the time checks, that refusal applies to new requests
only: a retry of an accepted send still gets its stored result (an authorization that
lapsed since does not undo an acceptance). Malformed material is a parameter error and
refused before anything else.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from gapline.meshline import (
    CurrentDevices,
    SendParams,
    authorize_delivery,
    check_account_id,
    check_message_id,
    parse_authorization,
    verify_envelope,
)
from gapline.relay._errors import RelayFailure
from gapline.relay._methods._access import AccessReader
from gapline.relay._methods._base import (
    Call,
    Method,
    SessionMode,
    compact,
    int_param,
    member_name,
    require,
    stored,
)
from gapline.relay._methods._core import RelayCore
from gapline.relay._store import KeyBox, NewSend

__all__ = ["MessageMethods", "digest_and_parts", "new_send"]


def digest_and_parts(params: dict[str, Any]) -> tuple[str, dict[str, str], list[str], list[str]]:
    """The digest of the complete params' canonical form, and the parts the store keeps.

    Idempotency compares the canonical JSON of the complete params. Sorted-key compact
    json.dumps of the strictly parsed value is a one-to-one function of that canonical
    form (same value <=> same text), so its digest decides equality exactly, at a fraction
    of the cost of RFC 8785 serialisation. The stored envelope and key boxes are those same
    sorted-key texts (member order carries no meaning in JSON; every signature covers the
    canonical form), so each part is serialised once, and the params text is assembled from
    the parts exactly as one sorted json.dumps would.
    """
    parts = {
        name: compact(value, sort_keys=True)
        for name, value in params.items()
        if name not in ("recipient_boxes", "sender_boxes")
    }
    recipient_texts = [compact(b, sort_keys=True) for b in params["recipient_boxes"]]
    parts["recipient_boxes"] = "[" + ",".join(recipient_texts) + "]"
    sender_texts: list[str] = []
    if "sender_boxes" in params:
        sender_texts = [compact(b, sort_keys=True) for b in params["sender_boxes"]]
        parts["sender_boxes"] = "[" + ",".join(sender_texts) + "]"
    canonical = "{" + ",".join(member_name(k) + parts[k] for k in sorted(parts)) + "}"
    return hashlib.sha256(canonical.encode()).hexdigest(), parts, recipient_texts, sender_texts


def new_send(
    send: SendParams,
    digest: str,
    parts: dict[str, str],
    recipient_texts: list[str],
    sender_texts: list[str],
    *,
    retention: int,
    now: int,
    refusal: Exception | None,
) -> NewSend:
    """The store's record of a verified send (or delivery): the objects as received
    (unknown fields included; members sorted)."""
    envelope = send.envelope
    return NewSend(
        from_account=envelope.from_,
        to_account=envelope.to,
        from_device_id=envelope.from_device_id,
        message_id=envelope.message_id,
        digest=digest,
        envelope=parts["envelope"],
        recipient_boxes=tuple(
            KeyBox(b.device_id, text)
            for b, text in zip(send.recipient_boxes, recipient_texts, strict=True)
        ),
        sender_boxes=None
        if send.sender_boxes is None
        else tuple(
            KeyBox(b.device_id, text)
            for b, text in zip(send.sender_boxes, sender_texts, strict=True)
        ),
        retention=retention,
        now=now,
        refusal=refusal,
    )


class MessageMethods:
    def __init__(self, core: RelayCore, access: AccessReader) -> None:
        self.core = core
        self.access = access

    def methods(self) -> list[Method]:
        return [
            Method("message.send", "POST", SessionMode.DEVICE, self.message_send),
            Method(
                "message.delivery.status",
                "GET",
                SessionMode.DEVICE,
                self.message_delivery_status,
                query={"message_id": "str"},
            ),
            Method(
                "message.timeline.sync",
                "GET",
                SessionMode.DEVICE,
                self.message_timeline_sync,
                query={"after": "int", "limit": "int"},
            ),
        ]

    async def authorization(self, send: SendParams, now: int) -> RelayFailure | None:
        """Receiving rule 4: None when the send may be delivered, else its refusal."""
        return (await self._authorize(send, now))[0]

    async def _authorize(self, send: SendParams, now: int) -> tuple[RelayFailure | None, bool]:
        """Rule 4's verdict, and whether this relay holds the recipient's state."""
        sender, recipient = send.envelope.from_, send.envelope.to
        if sender == recipient:
            # The library refuses material on self-delivery without consulting the devices.
            verdict = authorize_delivery(
                send.authorization,
                sender=sender,
                recipient=recipient,
                recipient_devices=CurrentDevices(recipient, {}),
                recipient_profile=None,
                now=now,
                context=self.core.context,
            )
        else:
            access = await self.access.of(recipient)
            if access is None:
                # Not an account of this relay: its home relay judges rule 4 (standalone, the
                # store finds no valid recipient device: device_unknown). Material that does
                # not even parse is still a bad request.
                if send.authorization is not None:
                    parse_authorization(send.authorization)
                return None, False
            verdict = authorize_delivery(
                send.authorization,
                sender=sender,
                recipient=recipient,
                recipient_devices=access.devices,
                recipient_profile=access.profile,
                now=now,
                context=self.core.context,
            )
        if verdict.allowed:
            return None, True
        if verdict.code == "bad_request":
            verdict.check()  # a parameter error: raised whether or not this is a retry
        return RelayFailure(verdict.code or "forbidden", verdict.message), True

    async def message_send(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        session = require(call, SessionMode.DEVICE)
        send = SendParams.from_wire(params)
        envelope = send.envelope
        check_account_id(envelope.from_, core.context, field="from")
        check_account_id(envelope.to, core.context, field="to")
        if envelope.from_ != session.account or envelope.from_device_id != session.device_id:
            raise RelayFailure("forbidden", "envelope from/from_device_id must be the session's")
        digest, parts, recipient_texts, sender_texts = digest_and_parts(params)
        now = core.now()
        # Time and authorization checks refuse only new requests: a retry of an accepted
        # message still gets its result after the age limit has passed, so the store raises
        # these after its duplicate check.
        refusal: RelayFailure | None = None
        if envelope.created_at > now + core.config.clock_skew:
            refusal = RelayFailure("clock_skew", "envelope created_at is in the relay's future")
        elif envelope.created_at < now - core.config.delivery_age_limit:
            refusal = RelayFailure(
                "message_expired", "the envelope is older than the delivery age limit"
            )
        verify_envelope(envelope, await core.signing_key(session.device_id or ""), core.context)
        denied, held_here = await self._authorize(send, now)
        new = new_send(
            send,
            digest,
            parts,
            recipient_texts,
            sender_texts,
            retention=core.config.retention,
            now=now,
            refusal=refusal or denied,
        )
        outbound = core.outbound
        if outbound is not None and envelope.to != envelope.from_:
            # The recipient's route decides who serves it: another relay gets the message
            # through the queue and message.deliver, and judges rule 4 itself (a refusal
            # from state this relay may still hold does not apply then).
            status = await outbound.accept_outbound(
                params, replace(new, refusal=refusal), session.device_id or "", held_here
            )
            if status is not None:
                return status
        accepted = await core.store.sends.accept(new)
        if core.on_appended is not None and accepted.appended:
            core.on_appended(accepted)
        return accepted.result.to_json()

    async def message_delivery_status(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        session = require(call, SessionMode.DEVICE)
        message_id = check_message_id(params.get("message_id"))
        result = await core.store.sends.delivery_status(session.account, message_id, core.now())
        return result.to_json()

    async def message_timeline_sync(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        session = require(call, SessionMode.DEVICE)
        after = int_param(params, "after", minimum=-1, default=-1)
        limit = int_param(params, "limit", minimum=1, default=core.config.page_limit)
        limit = min(limit, core.config.page_limit)
        page = await core.store.timelines.sync(
            session.account, session.device_id or "", after, limit, core.now()
        )
        out: dict[str, Any] = {
            "items": [
                {
                    "sequence": i.sequence,
                    "envelope": stored(i.envelope),
                    "key_box": stored(i.key_box),
                    "accepted_at": i.accepted_at,
                }
                for i in page.items
            ],
            "certificates": [stored(c) for c in page.certificates],
            "has_more": page.has_more,
        }
        if page.has_retention_gap:
            out["has_retention_gap"] = True
        return out
