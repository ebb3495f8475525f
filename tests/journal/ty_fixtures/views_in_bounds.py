"""Must PASS ty: each collaborator calls only its own slice, and the bound store fits every view."""

from gapline.journal import (
    AdmissionView,
    ConversationReadView,
    DeliveryView,
    DispatchView,
    HydrationView,
    InboundEvent,
    JournalStore,
    MembershipView,
    PendingView,
    RefetchView,
    ReplayView,
    TurnView,
)


async def ingress(view: AdmissionView, event: InboundEvent) -> None:
    await view.admit(event, epoch=await view.epoch(event.room_id))


async def worker(view: DeliveryView) -> None:
    for delivery in await view.claim(10):
        await view.acknowledge(delivery, "$sent")


def bind(store: JournalStore) -> None:
    bot = store.principal("@bot:example.org")
    views: tuple[
        AdmissionView,
        ReplayView,
        PendingView,
        DispatchView,
        ConversationReadView,
        HydrationView,
        RefetchView,
        MembershipView,
        TurnView,
        DeliveryView,
    ] = (bot, bot, bot, bot, bot, bot, bot, bot, bot, bot)
    del views
