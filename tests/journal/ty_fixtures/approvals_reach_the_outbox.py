"""Must FAIL ty: an approval collaborator holding an ApprovalDeliveryView reaches for the
generic outbox (enqueue) and for the worker's claim: cards go through open_approval only."""

from gapline.journal import ApprovalDeliveryView, DeliveryRequest


async def post_card(view: ApprovalDeliveryView, request: DeliveryRequest) -> None:
    await view.enqueue(request)
    await view.claim(10)
