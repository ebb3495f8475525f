"""gapline.journal: the durable single owner of the Matrix events a bot receives.

Open a :class:`JournalStore` on a :mod:`gapline.storage` backend and bind it to a
principal (``store.principal("@bot:example.org")``); collaborators take the narrow
view they need (``AdmissionView``, ``ReplayView``, ``DeliveryView``, ...). Usage and
the rules it keeps: docs/journal.md.
"""

from gapline.journal._outbox import transaction_id
from gapline.journal._progress import PROGRESS_STATUSES, STREAM_STATUS_KEY, is_streaming_progress
from gapline.journal._sidecar import SIDECAR_KEY
from gapline.journal._store import JournalStore, PrincipalJournal
from gapline.journal._types import (
    AckOutcome,
    AdmitOutcome,
    ChunkOutcome,
    ConsumerClaim,
    ConversationKey,
    ConversationPage,
    ConversationRow,
    Coverage,
    Cursor,
    Delivery,
    DeliveryRequest,
    DeliveryStage,
    DepartureOutcome,
    DepartureSource,
    EnqueueOutcome,
    EventKind,
    InboundEvent,
    InvalidCursor,
    JournalError,
    PendingEvent,
    Provenance,
    RefreshDebt,
    Revision,
    TurnNotCompleted,
    TurnRecord,
    TurnState,
    UnknownEvent,
    UnknownTurn,
    decode_thread_id,
    encode_thread_id,
)
from gapline.journal._views import (
    AdmissionView,
    ConversationReadView,
    DeliveryView,
    DispatchView,
    HydrationView,
    MembershipView,
    PendingView,
    RefetchView,
    ReplayView,
    TurnView,
)

__all__ = [
    "PROGRESS_STATUSES",
    "SIDECAR_KEY",
    "STREAM_STATUS_KEY",
    "AckOutcome",
    "AdmissionView",
    "AdmitOutcome",
    "ChunkOutcome",
    "ConsumerClaim",
    "ConversationKey",
    "ConversationPage",
    "ConversationReadView",
    "ConversationRow",
    "Coverage",
    "Cursor",
    "Delivery",
    "DeliveryRequest",
    "DeliveryStage",
    "DeliveryView",
    "DepartureOutcome",
    "DepartureSource",
    "DispatchView",
    "EnqueueOutcome",
    "EventKind",
    "HydrationView",
    "InboundEvent",
    "InvalidCursor",
    "JournalError",
    "JournalStore",
    "MembershipView",
    "PendingEvent",
    "PendingView",
    "PrincipalJournal",
    "Provenance",
    "RefetchView",
    "RefreshDebt",
    "ReplayView",
    "Revision",
    "TurnNotCompleted",
    "TurnRecord",
    "TurnState",
    "TurnView",
    "UnknownEvent",
    "UnknownTurn",
    "decode_thread_id",
    "encode_thread_id",
    "is_streaming_progress",
    "transaction_id",
]

# -- runtime (ingress, hydration, refetch, reads, delivery, the bot) -----------------------
from gapline.journal._bot import Bot, BotConfig, TurnRunner
from gapline.journal._faults import FaultPoint, fault_point
from gapline.journal._handlers import (
    BUILTIN_HANDLERS,
    Conversation,
    Final,
    Handler,
    HandlerError,
    HandlerStream,
    Progress,
    TriggerMessage,
    echo,
    resolve_handler,
)
from gapline.journal._hydration import (
    HydrationBounds,
    HydrationFailed,
    Hydrator,
    RecursionNotHonoured,
    StopReason,
)
from gapline.journal._ingress import Ingress, IngressPolicy, RuntimeState
from gapline.journal._reader import (
    BoundConversation,
    ConversationReader,
    StaleConversation,
)
from gapline.journal._refetch import PointRefetcher, RefetchFailed
from gapline.journal._sidecar import SidecarRef, SidecarUnresolved
from gapline.journal._worker import DeliveryWorker

__all__ += [
    "BUILTIN_HANDLERS",
    "Bot",
    "BotConfig",
    "BoundConversation",
    "Conversation",
    "ConversationReader",
    "DeliveryWorker",
    "FaultPoint",
    "Final",
    "Handler",
    "HandlerError",
    "HandlerStream",
    "HydrationBounds",
    "HydrationFailed",
    "Hydrator",
    "Ingress",
    "IngressPolicy",
    "PointRefetcher",
    "Progress",
    "RecursionNotHonoured",
    "RefetchFailed",
    "RuntimeState",
    "SidecarRef",
    "SidecarUnresolved",
    "StaleConversation",
    "StopReason",
    "TriggerMessage",
    "TurnRunner",
    "echo",
    "fault_point",
    "resolve_handler",
]
