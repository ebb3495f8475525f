"""Must FAIL ty: the delivery worker accepts only a MatrixDeliveryView and cannot admit or settle."""

from gapline.journal import InboundEvent, MatrixDeliveryView


async def work(view: MatrixDeliveryView, event: InboundEvent) -> None:
    await view.admit(event, epoch=0)
    await view.settle(event.event_id)
