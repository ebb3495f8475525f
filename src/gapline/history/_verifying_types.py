"""The engine's event for interactive verification: where one flow is, for a prompt.

Part of the protocol vocabulary re-exported by ``_types`` (wire:
``{"VerificationChanged": {...}}``). One event is published each time a flow's
state (or what it shows) changes, whichever side moved it: a request or start
that arrived through sync, the other side's answers, this client's commands, a
timeout.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["VerificationChanged", "VerificationPhase"]


class VerificationPhase(enum.Enum):
    """Where a flow is. ``ShowSas``: compare ``emoji`` (or ``decimals``) and answer
    ``ConfirmVerification``; ``Done``: verified; ``Cancelled``: see ``cancel_code``."""

    Requested = "Requested"  # asked, not answered yet (ours, or theirs to accept)
    Ready = "Ready"  # both sides agreed to verify; the SAS is about to start
    Started = "Started"  # a SAS start sent or received (theirs to accept, without a request)
    Accepted = "Accepted"  # the method agreed; the keys are being exchanged
    ShowSas = "ShowSas"
    Confirmed = "Confirmed"  # we said they match; waiting for the other side
    Done = "Done"
    Cancelled = "Cancelled"


@dataclass(frozen=True, slots=True, kw_only=True)
class VerificationChanged:
    """One flow's state, whole (a reader keeps the last one per ``flow_id``).

    ``outgoing``: this device asked (a prompt shows "waiting" rather than "accept?").
    ``emoji`` (seven (symbol, English name) pairs) and ``decimals`` (three numbers) are
    set from ``ShowSas`` on. ``cancel_code`` is the spec's ``m.key.verification.cancel``
    code (``m.mismatched_sas``, ``m.timeout``, ``m.user``, ...) with ``cancel_reason``;
    ``cancelled_by_us`` says which side ended it. ``cross_signed`` (at ``Done``): the
    verified device (our own) or the user's master key (another user) was signed with
    our cross-signing keys and the signature uploaded.
    """

    flow_id: str
    other_user: str
    other_device: str | None = None
    room_id: str | None = None
    state: VerificationPhase = VerificationPhase.Requested
    outgoing: bool = False
    emoji: tuple[tuple[str, str], ...] | None = None
    decimals: tuple[int, int, int] | None = None
    cancel_code: str | None = None
    cancel_reason: str | None = None
    cancelled_by_us: bool = False
    cross_signed: bool = False

    @property
    def finished(self) -> bool:
        return self.state in (VerificationPhase.Done, VerificationPhase.Cancelled)
