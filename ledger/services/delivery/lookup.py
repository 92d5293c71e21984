"""What the retry decision asks of delivery evidence before a NON_RETRYABLE send is repeated."""

from django.db.models import F, Q

from ledger.errors import AlreadyDelivered
from ledger.models import EffectDelivery, Operation
from ledger.states import DeliveryState, EffectClass

# The provider has the message, or will deliver it: sending again would deliver it twice.
BLOCKS_RETRY = (DeliveryState.DELIVERED, DeliveryState.DEFERRED)


def delivery_refuses_retry(op: Operation) -> AlreadyDelivered | None:
    """For a NON_RETRYABLE operation: its delivery looked up by message id — the delivery of
    the attempt being retried, or any delivery of the tenant under the message id that
    attempt's outcome reported (``provider_request_id``). DELIVERED or DEFERRED refuses the
    retry (409 ALREADY_DELIVERED); BOUNCED, or no delivery recorded, leaves the decision as
    it was (a person approves the retry). Other classes are not asked."""
    if op.effect_class != EffectClass.NON_RETRYABLE:
        return None
    named = Q(operation=op, attempt=op.attempt)
    if op.provider_request_id:
        named |= Q(tenant_id=op.tenant_id, message_id=op.provider_request_id)
    found = EffectDelivery.objects.filter(named, state__in=BLOCKS_RETRY).order_by("updated_at").last()
    if found is None:
        return None
    return AlreadyDelivered(
        f"the provider reports this message {found.state}: a retry would send it again",
        delivery_state=found.state,
        message_id=found.message_id,
    )


def deliveries_pending(*, worker_id: int) -> int:
    """Deliveries still DEFERRED of the sends this worker dispatched (the attempt it
    dispatched under one of its own fencing tokens): what a drain reports as pending."""
    return (
        EffectDelivery.objects.filter(
            state=DeliveryState.DEFERRED,
            operation__run__lease_grants__worker_id=worker_id,
            operation__run__lease_grants__fencing_token=F("operation__fencing_token"),
            attempt=F("operation__attempt"),
        )
        .values("pk")
        .distinct()
        .count()
    )
