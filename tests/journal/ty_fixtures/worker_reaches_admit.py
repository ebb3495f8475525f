"""Must FAIL ty: the delivery worker accepts only a DeliveryView and cannot admit or settle."""

from gapline.journal import DeliveryView, InboundEvent


async def work(view: DeliveryView, event: InboundEvent) -> None:
    await view.admit(event, epoch=0)
    await view.settle(event.event_id)
