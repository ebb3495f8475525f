"""Must PASS ty: each collaborator calls only its own slice, and the bound store fits
every one of the eleven views."""

from gapline.journal import (
    AdmissionView,
    ApprovalDeliveryView,
    ApprovalRequest,
    ConversationReadView,
    DispatchView,
    HistoryRecoveryRecordView,
    HydrationView,
    InboundEvent,
    JournalStore,
    MatrixDeliveryView,
    MembershipView,
    PendingTurnView,
    RelationView,
    ReplayView,
)


async def ingress(view: AdmissionView, event: InboundEvent) -> None:
    await view.admit(event, epoch=await view.epoch(event.room_id))


async def worker(view: MatrixDeliveryView) -> None:
    for delivery in await view.claim(10):
        await view.acknowledge(delivery, "$sent")


async def approvals(view: ApprovalDeliveryView, request: ApprovalRequest) -> None:
    await view.open_approval(request)
    await view.approval(request.approval_id)


def bind(store: JournalStore) -> None:
    bot = store.principal("@bot:example.org")
    views: tuple[
        AdmissionView,
        ReplayView,
        DispatchView,
        PendingTurnView,
        RelationView,
        ConversationReadView,
        HistoryRecoveryRecordView,
        HydrationView,
        MatrixDeliveryView,
        ApprovalDeliveryView,
        MembershipView,
    ] = (bot, bot, bot, bot, bot, bot, bot, bot, bot, bot, bot)
    del views
