"""The journal's vocabulary: envelopes, keys, cursors, outcomes.

Nothing here names a principal. The principal-bound store view supplies it, so an
envelope or a key can never point a caller at another bot's rows.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AckOutcome",
    "AdmitOutcome",
    "AnswerOutcome",
    "Approval",
    "ApprovalAnswer",
    "ApprovalRequest",
    "ChunkOutcome",
    "ConsumerClaim",
    "ConversationKey",
    "ConversationPage",
    "ConversationRow",
    "Coverage",
    "Cursor",
    "Decision",
    "Delivery",
    "DeliveryPurpose",
    "DeliveryRequest",
    "DeliveryStage",
    "DepartureOutcome",
    "DepartureSource",
    "EnqueueOutcome",
    "EventKind",
    "EventRole",
    "EventRoleKind",
    "InboundEvent",
    "InvalidCursor",
    "JournalError",
    "PendingEvent",
    "Provenance",
    "RefreshDebt",
    "Revision",
    "ToolCall",
    "TurnNotCompleted",
    "TurnRecord",
    "TurnState",
    "UnknownEvent",
    "UnknownTurn",
    "canonical_json",
    "decode_thread_id",
    "encode_thread_id",
]


class JournalError(Exception):
    """Base of the journal's own errors (storage errors come from gapline.storage)."""


class InvalidCursor(JournalError, ValueError):
    """A cursor string is not ``<created_ts>:<event_id>``."""


class UnknownEvent(JournalError, LookupError):
    """No journal row of this principal has that event id."""


class UnknownTurn(JournalError, LookupError):
    """No turn of this principal has that id."""


class TurnNotCompleted(JournalError):
    """A FINAL delivery was enqueued before the turn's result was durable."""


# -- conversation identity ---------------------------------------------------------


def encode_thread_id(thread_id: str | None) -> str:
    """The one boundary where an unthreaded conversation (None) becomes storage's ''.

    Storage keeps ``thread_id TEXT NOT NULL`` so no key or uniqueness constraint
    depends on nullable equality (NULL = NULL is not true in SQL).
    """
    if thread_id == "":
        raise ValueError("thread_id '' is reserved: an unthreaded conversation is None")
    return "" if thread_id is None else thread_id


def decode_thread_id(stored: str) -> str | None:
    """Storage's '' back to the API's None."""
    return None if stored == "" else stored


@dataclass(frozen=True, slots=True)
class ConversationKey:
    """A conversation of the bound principal: a room's main timeline or one thread."""

    room_id: str
    thread_id: str | None = None


@dataclass(frozen=True, slots=True, order=True)
class Cursor:
    """A stable position in a conversation, compared as the row value
    ``(created_ts, logical_event_id)``. ``str()`` is ``<created_ts>:<event_id>``."""

    created_ts: int
    logical_event_id: str

    def __str__(self) -> str:
        return f"{self.created_ts}:{self.logical_event_id}"

    @classmethod
    def start(cls) -> Cursor:
        """Before every row: read forwards ``after`` it to begin at the oldest message."""
        return cls(-(2**63), "")

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """Parse ``<created_ts>:<event_id>``; event ids may themselves contain ':'."""
        ts, sep, event_id = text.partition(":")
        shown = repr(text if len(text) <= 60 else text[:57] + "...")
        # ASCII digits counted before converting (int() takes "١٢" and refuses 4,301
        # digits), and an event id within the Matrix limit of 255 bytes.
        if (
            not sep
            or not event_id
            or not (ts.isascii() and ts.isdigit())
            or len(event_id.encode("utf-8", "surrogatepass")) > 255
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in event_id)
        ):
            raise InvalidCursor(f"not a cursor (want <created_ts>:<event_id>): {shown}")
        if len(ts) > 19 or int(ts) >= 2**63:  # a BIGINT column: larger never matches
            raise InvalidCursor(f"created_ts out of range in {shown}")
        return cls(int(ts), event_id)


# -- admission ------------------------------------------------------------------------


class EventKind(enum.Enum):
    """What the runtime will do with an event; decides retention and fencing."""

    ACTIONABLE = "actionable"  # turn-backed: a handler answers it; keeps replay input
    CONTEXT_ONLY = "context_only"  # projected, then compacted to its identity
    REACTION = "reaction"
    REDACTION = "redaction"  # still owes cleanup: never swept by a fence
    APPROVAL_REPLY = "approval_reply"
    DECRYPTION_FAILURE = "decryption_failure"


class Provenance(enum.Enum):
    """How the sync answer classified the event; recorded, never inferred locally."""

    LIVE = "live"
    RECOVERED = "recovered"
    HISTORY = "history"


@dataclass(frozen=True, slots=True)
class InboundEvent:
    """One Matrix event as admitted. ``content`` is the raw Matrix content (JSON text
    or bytes): the exact replay input for actionable events.

    ``thread_id`` is the thread root for a threaded event, None otherwise.
    ``redacts`` is the redaction target for room versions that carry it at the top
    level (v11 keeps it in content, which is read too). ``resolved_text`` is the
    resolved sidecar plaintext when the content is a sidecar preview (the projection
    stores only that, never the preview). ``before_join`` marks a decryption failure
    from before our (re)join (the part of the joining sync's timeline that precedes our
    join): whenever its key comes, its upgrade is context only, never answered.
    """

    event_id: str
    room_id: str
    thread_id: str | None
    sender: str
    origin_server_ts: int
    type: str
    content: str | bytes
    kind: EventKind
    provenance: Provenance = Provenance.LIVE
    redacts: str | None = None
    resolved_text: str | None = None
    before_join: bool = False


class AdmitOutcome(enum.Enum):
    ADMITTED = "admitted"  # committed: journaled and projected
    DUPLICATE = "duplicate"  # this principal already holds the event id; nothing changed
    STALE_EPOCH = "stale_epoch"  # membership moved since the caller observed it; refused


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """A committed, unsettled event with its exact replay input.

    ``seq`` is durable receipt order; ``event.content`` is the bytes admitted
    (text was stored as UTF-8). ``epoch`` is the room's membership epoch at admission.
    """

    seq: int
    event: InboundEvent
    epoch: int


class ConsumerClaim(enum.Enum):
    CLAIMED = "claimed"
    ALREADY_SETTLED = "already_settled"
    STALE_EPOCH = "stale_epoch"  # membership moved: the event was settled against the new epoch


# -- projection and reads -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConversationRow:
    """One logical message at its latest visible revision."""

    event_id: str  # the logical (original) event id
    room_id: str
    thread_id: str | None
    sender: str
    created_ts: int  # origin_server_ts of the original
    body: str
    edited: bool
    revision_event_id: str  # the visible revision: event_id itself when unedited

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.created_ts, self.event_id)


@dataclass(frozen=True, slots=True)
class RefreshDebt:
    """A logical message whose visible body is cleared until a point refetch installs the
    server's revision. The token must be handed back unchanged to ``install_refetched``."""

    room_id: str
    logical_event_id: str
    created_ts: int
    refresh_token: str


@dataclass(frozen=True, slots=True)
class ConversationPage:
    """The newest ``limit`` logical messages before a cursor (or, read forwards, the
    oldest ``limit`` after one).

    ``rows`` are oldest first and never include a body-cleared row; those are in
    ``owing_refresh``. ``next_before`` is the cursor of the oldest row examined
    (visible or owed), or None when the conversation start was reached; a forward
    read sets ``next_after`` instead (None at the newest row). A thread's page also
    carries its ``root``, the message the thread is about, over and above the limit
    (its room row; a body-cleared root is owed like any row). ``not_ready`` says why a
    non-strict read served the projection as it is (its hydration failed).
    """

    rows: tuple[ConversationRow, ...]
    owing_refresh: tuple[RefreshDebt, ...]
    next_before: Cursor | None
    next_after: Cursor | None = None
    root: ConversationRow | None = None
    not_ready: str | None = None


@dataclass(frozen=True, slots=True)
class Revision:
    """A server-authoritative visible revision installed by the point refetch.

    ``content`` is the visible content (an edit's ``m.new_content``, or the original's
    content). ``event_id`` equals the logical event id when the original is visible.
    """

    event_id: str
    origin_server_ts: int
    content: str | bytes
    resolved_text: str | None = None


class ChunkOutcome(enum.Enum):
    PROJECTED = "projected"
    STALE_EPOCH = "stale_epoch"


@dataclass(frozen=True, slots=True)
class Coverage:
    """Published by hydration's final transaction for one conversation."""

    epoch: int
    reached_start: bool
    messages: int


# -- membership -----------------------------------------------------------------------


class DepartureSource(enum.Enum):
    LOCAL = "local"  # we left (or were told we are leaving) ourselves
    REPORTED = "reported"  # sync reported our membership gone


class DepartureOutcome(enum.Enum):
    ADVANCED_OWING_REPORT = "advanced_owing_report"  # LOCAL: epoch advanced, echo owed
    ADVANCED = "advanced"  # REPORTED with nothing owed: epoch advanced
    ECHO_RETIRED = "echo_retired"  # REPORTED: consumed one owed report, no advance
    ALREADY_REPORTED = "already_reported"  # REPORTED again by the same event: nothing done


# -- outbox and turns -----------------------------------------------------------------


class DeliveryStage(enum.Enum):
    INITIAL = "initial"
    FINAL = "final"


class DeliveryPurpose(enum.Enum):
    """What an outbox row carries; acknowledgement records each in its own table."""

    ANSWER = "answer"  # a turn's placeholder (INITIAL) and final edit (FINAL)
    APPROVAL_CARD = "approval_card"  # an approval card (INITIAL) and its resolution (FINAL)


@dataclass(frozen=True, slots=True)
class DeliveryRequest:
    """What a turn asks the outbox to send. ``content`` is the Matrix content JSON."""

    turn_id: str
    delivery_id: str
    stage: DeliveryStage
    room_id: str
    thread_id: str | None
    event_type: str
    content: str | bytes


@dataclass(frozen=True, slots=True)
class Delivery:
    """The exact stored delivery a worker sends: payload and target frozen at claim."""

    seq: int
    turn_id: str
    delivery_id: str
    stage: DeliveryStage
    room_id: str
    thread_id: str | None
    event_type: str
    content: bytes
    txn_id: str
    attempted: bool
    purpose: DeliveryPurpose = DeliveryPurpose.ANSWER


class EnqueueOutcome(enum.Enum):
    CREATED = "created"
    UPDATED = "updated"  # an unattempted row took the new payload
    FROZEN = "frozen"  # already attempted: payload and txn id kept, nothing changed
    ACKNOWLEDGED = "acknowledged"  # already delivered: nothing changed
    STALE_EPOCH = "stale_epoch"  # the turn was admitted under an older epoch: refused


class AckOutcome(enum.Enum):
    ACKNOWLEDGED = "acknowledged"
    LOST = "lost"  # another acknowledger won, or the row is gone: nothing written


class TurnState(enum.Enum):
    OPEN = "open"
    COMPLETED = "completed"  # handler result durable
    DELIVERED = "delivered"  # FINAL acknowledged: terminal


@dataclass(frozen=True, slots=True)
class TurnRecord:
    turn_id: str
    room_id: str
    thread_id: str | None
    source_event_id: str
    epoch: int  # the membership epoch that admitted the source
    state: TurnState
    result: bytes | None
    initial_event_id: str | None
    final_event_id: str | None


# -- approvals and interactive reactions ----------------------------------------------


def canonical_json(value: Any) -> str:
    """Sorted keys, no insignificant whitespace, UTF-8 kept: one text per JSON value."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One exact tool call a human is asked to approve.

    Its identity is the name and the canonical JSON of the arguments, so asking for the
    same call again (a turn rerun after a crash) finds the same card, and a card can
    never be read as approving a call that differs in any argument.
    """

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("a tool call needs a name")
        try:
            self.canonical_arguments()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the arguments of {self.name!r} are not JSON: {exc}") from None

    def canonical_arguments(self) -> str:
        return canonical_json(dict(self.arguments))

    def digest(self) -> str:
        joined = f"{self.name}\x1f{self.canonical_arguments()}".encode()
        return hashlib.sha256(joined).hexdigest()


class Decision(enum.Enum):
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"  # nobody allowed answered before the deadline
    CANCELLED = "cancelled"  # a membership fence retired the card or its turn


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What a turn asks to open: one card for one exact call.

    ``approval_id`` is derived from the turn and the call (``approval_id_for``), so a
    rerun asking the same call at the same point opens nothing new. ``card_content``
    is the card's Matrix content; ``expires_at`` is wall-clock milliseconds.
    """

    approval_id: str
    turn_id: str
    call: ToolCall
    approvers: frozenset[str]
    expires_at: int
    card_content: str | bytes


@dataclass(frozen=True, slots=True)
class Approval:
    """An approval as the store holds it: the exact call, its card, its decision."""

    approval_id: str
    turn_id: str
    room_id: str
    thread_id: str | None
    call: ToolCall
    approvers: tuple[str, ...]
    expires_at: int
    card_event_id: str | None  # known once the card's delivery was acknowledged
    decision: Decision | None  # None while waiting
    decided_by: str | None
    reason: str | None

    @property
    def approved(self) -> bool:
        return self.decision is Decision.APPROVED


class ApprovalAnswer(enum.Enum):
    """What an answer to a card did."""

    RECORDED = "recorded"  # this answer is the decision
    ALREADY_DECIDED = "already_decided"  # the first decision stands; nothing changed
    NOT_APPROVER = "not_approver"  # ignored: the sender may not decide
    EXPIRED = "expired"  # too late: the deadline passed
    TOMBSTONED = "tombstoned"  # the card was retired by a membership fence
    STALE_EPOCH = "stale_epoch"  # the card belongs to an older membership
    UNKNOWN_CARD = "unknown_card"  # no card of this principal has that event id


@dataclass(frozen=True, slots=True)
class AnswerOutcome:
    """What ``resolve_approval`` did, and the approval as it now stands (None only for
    ``UNKNOWN_CARD``)."""

    answer: ApprovalAnswer
    approval: Approval | None


class EventRoleKind(enum.Enum):
    APPROVAL_CARD = "approval_card"  # an event id of one of our approval cards
    CARD_IN_FLIGHT = "card_in_flight"  # unknown, but a card of the room awaits its id
    INTERACTIVE = "interactive"  # a message of ours a turn asked reactions on


@dataclass(frozen=True, slots=True)
class EventRole:
    """What the journal knows about an event that another event relates to."""

    kind: EventRoleKind
    approval_id: str | None = None
    turn_id: str | None = None
    keys: tuple[str, ...] = ()
