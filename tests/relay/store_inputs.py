"""Inputs for tests that drive the relay store directly, below the transports."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gapline.relay._store import KeyBox, NewSend


def new_send(
    sender: str,
    to: str,
    message_id: str,
    devices: Mapping[str, Sequence[str]],
    *,
    now: int,
    retention: int,
    **changes: Any,
) -> NewSend:
    """A verified send from ``sender``'s first device, boxed for every device of ``to`` and,
    for the sent record, of ``sender``; ``changes`` replace any other field."""
    send = NewSend(
        from_account=sender,
        to_account=to,
        from_device_id=devices[sender][0],
        message_id=message_id,
        digest=f"digest-{message_id}",
        envelope=f'{{"id":"{message_id}"}}',
        recipient_boxes=tuple(KeyBox(d, f'{{"to":"{d}"}}') for d in devices[to]),
        sender_boxes=tuple(KeyBox(d, f'{{"from":"{d}"}}') for d in devices[sender]),
        retention=retention,
        now=now,
    )
    return dataclasses.replace(send, **changes)
