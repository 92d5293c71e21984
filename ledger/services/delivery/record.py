"""Delivery evidence of an effect: one state per attempt of an operation, and every record
that reached it, each with its DELIVERY_RECORDED event in the run's chain.

Two writers, both under the run's lock: the worker holding the run's lease (fenced, as an
outcome is: ``ledger.services.fence.deliveries.delivery_record``), and a provider's signed webhook, which is no worker,
holds no lease and presents no fencing token (:func:`delivery_record_from_provider`, actor
``provider:<source>``); its signature is its credential, checked before this module runs.

Rules (``ledger.states.DELIVERY_TRANSITIONS``): the first record of an attempt sets its
state; then DEFERRED -> DELIVERED | BOUNCED; DELIVERED and BOUNCED are final. A record
along no edge (a late DEFERRED after DELIVERED) is kept in the history, with its event
(``applied: false``), and moves nothing. A ``provider_event_id`` is recorded once per tenant:
the same record again answers as the first time; other content under it is 422
IDEMPOTENCY_MISMATCH. An operation never dispatched has nothing delivered: 409 WRONG_PHASE.
"""

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ledger.boundary import check_text
from ledger.errors import IdempotencyMismatch, InvalidInput, NotFound, WrongPhase
from ledger.models import EffectDelivery, EffectDeliveryRecord, Operation, Run, Tenant
from ledger.services.core.fencing import lock
from ledger.services.evidence.append import ChainBatch, json_safe
from ledger.states import DELIVERY_TRANSITIONS, DeliveryState

MAX_MESSAGE_ID = 300
MAX_PROVIDER_EVENT_ID = 200


@dataclass(frozen=True)
class DeliveryReport:
    """What one delivery report says, checked at the secret boundary (:func:`report_checked`)."""

    state: DeliveryState
    message_id: str
    provider_event_id: str
    occurred_at: datetime


@dataclass(frozen=True)
class Recorded:
    record: EffectDeliveryRecord
    delivery: EffectDelivery
    replayed: bool


def report_checked(
    *, state: object, message_id: object, provider_event_id: object, occurred_at: object
) -> DeliveryReport:
    """A report from what a caller sent: every field checked, each refusal naming its field
    (422), never echoing a value; a credential-like id is 422 FORBIDDEN_FIELD."""
    if state not in DeliveryState.values:
        raise InvalidInput("status must be DELIVERED, BOUNCED or DEFERRED", field="status")
    texts = {
        "message_id": (message_id, MAX_MESSAGE_ID, 0),
        "provider_event_id": (provider_event_id, MAX_PROVIDER_EVENT_ID, 1),
    }
    for name, (value, longest, shortest) in texts.items():
        if not isinstance(value, str) or not shortest <= len(value) <= longest:
            raise InvalidInput(f"{name} must be a string of {shortest} to {longest} characters", field=name)
        if value:
            check_text(value, path=name)
    if not isinstance(occurred_at, datetime) or occurred_at.tzinfo is None:
        raise InvalidInput("occurred_at must be a date and time with a time zone", field="occurred_at")
    return DeliveryReport(
        state=DeliveryState(state),
        message_id=str(message_id),
        provider_event_id=str(provider_event_id),
        occurred_at=occurred_at,
    )


def occurred_at_parsed(value: object) -> datetime:
    """When a report says the delivery happened: ISO 8601 with a zone, or Unix seconds (as
    Stripe's ``created``). Anything else: 422 naming occurred_at."""
    if type(value) is int and 0 <= value < 2**33:
        return datetime.fromtimestamp(value, tz=UTC)
    parsed = None
    if isinstance(value, str):
        try:
            parsed = parse_datetime(value)
        except ValueError:
            parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise InvalidInput("occurred_at must be an ISO 8601 time with a zone, or Unix seconds", field="occurred_at")
    return parsed


def delivery_record_from_provider(
    *, tenant: Tenant, operation_id: object, actor: str, report: DeliveryReport
) -> Recorded:
    """A provider's webhook records a delivery: no fencing token (a provider holds no
    lease), but the same run lock every writer of the run's chain takes, so its event is
    ordered with the worker's. Accepted whatever the run's status: evidence that arrives
    after the run ended is still evidence."""
    with transaction.atomic():
        locked = lock(tenant=tenant, operation_id=operation_id)
        if locked.operation is None:
            raise NotFound("operation not found")
        batch = ChainBatch(timezone.now())
        recorded = delivery_write(run=locked.run, op=locked.operation, report=report, batch=batch, actor=actor)
        batch.commit()
    return recorded


def delivery_write(*, run: Run, op: Operation, report: DeliveryReport, batch: ChainBatch, actor: str) -> Recorded:
    """Under the run's lock: the record, its event, and the attempt's state where the rules
    let it move. The attempt is the one whose message the report names, else the current."""
    known = EffectDeliveryRecord.objects.filter(
        tenant_id=op.tenant_id, provider_event_id=report.provider_event_id
    ).first()
    if known is not None:
        return _replayed(known, op, report)
    if op.dispatched_at is None and op.attempt == 1:
        raise WrongPhase(phase=op.phase, wanted="an operation that has been dispatched")
    attempt = _attempt_of(op, report.message_id)
    current = EffectDelivery.objects.filter(operation=op, attempt=attempt).first()
    previous = DeliveryState(current.state) if current is not None else None
    applied = previous is None or report.state in DELIVERY_TRANSITIONS[previous]
    event = batch.append(
        run,
        "DELIVERY_RECORDED",
        actor=actor,
        fields=json_safe(
            {
                "operation_id": op.pk,
                "attempt": attempt,
                "status": report.state.value,
                "previous_status": previous.value if previous is not None else None,
                "applied": applied,
                "message_id": report.message_id,
                "provider_event_id": report.provider_event_id,
                "occurred_at": report.occurred_at,
            }
        ),
    )
    delivery = _state_moved(op, attempt, current, report, applied=applied, now=batch.now)
    record = EffectDeliveryRecord.objects.create(
        operation=op,
        attempt=attempt,
        tenant_id=op.tenant_id,
        state=report.state,
        message_id=report.message_id,
        provider_event_id=report.provider_event_id,
        occurred_at=report.occurred_at,
        recorded_at=batch.now,
        actor=actor,
        applied=applied,
        seq=event.seq,
    )
    return Recorded(record=record, delivery=delivery, replayed=False)


def _replayed(known: EffectDeliveryRecord, op: Operation, report: DeliveryReport) -> Recorded:
    """The same provider event again: answered as the first time, or refused if it now says
    something else."""
    same = (known.operation_id, known.state, known.message_id) == (op.pk, report.state, report.message_id)
    if not same:
        raise IdempotencyMismatch(
            "this provider_event_id was recorded with another operation, status or message_id",
            field="provider_event_id",
        )
    delivery = EffectDelivery.objects.get(operation_id=known.operation_id, attempt=known.attempt)
    return Recorded(record=known, delivery=delivery, replayed=True)


def _attempt_of(op: Operation, message_id: str) -> int:
    """The attempt whose message ``message_id`` names (a late report about an earlier
    send), else the operation's current attempt."""
    if message_id:
        earlier = (
            EffectDelivery.objects.filter(operation=op, message_id=message_id).values_list("attempt", flat=True).first()
        )
        if earlier is not None:
            return earlier
    return op.attempt


def _state_moved(
    op: Operation,
    attempt: int,
    current: EffectDelivery | None,
    report: DeliveryReport,
    *,
    applied: bool,
    now: datetime,
) -> EffectDelivery:
    """The attempt's state after the report: created by the first record, moved by one along
    an edge (a conditional UPDATE on the state read under the run's lock), else unchanged."""
    if current is None:
        return EffectDelivery.objects.create(
            operation=op,
            attempt=attempt,
            tenant_id=op.tenant_id,
            state=report.state,
            message_id=report.message_id,
            occurred_at=report.occurred_at,
            updated_at=now,
        )
    if not applied:
        return current
    changes = {"state": report.state.value, "occurred_at": report.occurred_at, "updated_at": now}
    if not current.message_id and report.message_id:
        changes["message_id"] = report.message_id
    moved = EffectDelivery.objects.filter(pk=current.pk, state=current.state).update(**changes)
    if moved != 1:  # the run's lock excludes every other writer of this row
        raise AssertionError("a delivery state changed under the run's lock")
    for name, value in changes.items():
        setattr(current, name, value)
    return current
