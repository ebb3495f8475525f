"""Must FAIL ty: a hydrator holding a HydrationView reaches for the outbox."""

from gapline.journal import DeliveryRequest, HydrationView


async def hydrate(view: HydrationView, request: DeliveryRequest) -> None:
    await view.enqueue(request)
