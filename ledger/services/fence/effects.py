"""One call for an effect: intend, authorize and dispatch, as far as nothing waits for a
person (``POST /runs/{run_id}/effects``; docs/api.md "Start an effect").

``operation_start`` composes the three services of ``operations.py``; each still takes the
fence, makes its own checks and records its own transition, so every refusal keeps its code.
The three run in ONE database transaction: the run stays locked from the intent to the
dispatch, so nothing moves the operation between the steps and a replay's phase, read under
that lock, is the one it acts on. The steps take no savepoint each (``one_transaction``: a
savepoint per step cost a MultiXact per row and twice the backend CPU); when a step's write
raises, that transaction rolls back whole and the call starts again with a savepoint per step.
What a refusal leaves is what the separate calls would have left, committed with the steps
before it:

* refused at the intent (STALE_TOKEN, RUN_CANCELLED, IDEMPOTENCY_MISMATCH, ...): as
  ``POST /runs/{run_id}/operations`` leaves it (a stale token's record in the chain);
* refused at authorize (DENY_*, EFFECTS_HELD, ...): the intent is kept, PLANNED, or DENIED
  where authorize records the refusal; a person's approval: PENDING_APPROVAL, not a refusal;
* refused at dispatch: the operation is AUTHORIZED (the fence or a held effect refused) or
  DENIED (a check failed again).

The same call again under the same idempotency key continues from where the operation
stands: PLANNED or PENDING_APPROVAL are authorized (and dispatched), AUTHORIZED is
dispatched, and any later phase is answered as it is, without a second dispatch.

A caller that names the operation record versions it reads (``reads``) is not taken past a
record it cannot read: the call stops after the intent and answers it, as the separate
calls let a worker refuse the intent's answer before it authorizes anything.
"""

import functools
import uuid
from collections.abc import Collection
from dataclasses import dataclass

from django.db import transaction

from ledger.errors import ApprovalRequired, DomainError
from ledger.models import Operation, Worker
from ledger.observability import metrics
from ledger.services.authority.breaker import Levers
from ledger.services.core.fencing import one_transaction
from ledger.services.core.intent import Intent
from ledger.services.fence.operations import operation_authorize, operation_dispatch_terms, operation_intend
from ledger.states import Phase

# The phases an operation is authorized from by this call.
TO_AUTHORIZE = (Phase.PLANNED, Phase.PENDING_APPROVAL)


@dataclass(frozen=True)
class Started:
    """Where ``operation_start`` left an operation: ``phase`` is DISPATCHED when this call (or
    an earlier one under the same key) dispatched it, PENDING_APPROVAL with ``approval_id``
    while a person must decide, or the later phase an earlier call reached."""

    operation: Operation
    phase: Phase
    created: bool  # this call recorded the intent
    approval_id: uuid.UUID | None = None
    # This call dispatched it (False for an operation an earlier call dispatched and that no
    # outcome has moved since: the caller cannot know whether the effect happened).
    dispatched: bool = False
    # What this call's dispatch reserved and the breaker's levers (``operations.Dispatched``).
    reservation_id: uuid.UUID | None = None
    levers: Levers | None = None


def operation_start(
    *,
    worker: Worker,
    run_id: object,
    fencing_token: int,
    intent: Intent,
    credential_lease_id: object = None,
    reads: Collection[int] | None = None,
) -> Started:
    """Intend, authorize and dispatch ``intent`` on the run under ``fencing_token``, in one
    transaction; a refusal is raised once the steps before it (and its own record) have
    committed. ``credential_lease_id`` is authorize's; ``reads``, the record versions the
    caller reads (None: any)."""
    start = functools.partial(
        _start,
        worker=worker,
        run_id=run_id,
        fencing_token=fencing_token,
        intent=intent,
        credential_lease_id=credential_lease_id,
        reads=reads,
    )
    refusal: DomainError | None = None
    # First the steps in one transaction without a savepoint each (fencing.one_transaction).
    with transaction.atomic():
        try:
            with one_transaction(), metrics.counts_held() as counts:
                started = start()
        except DomainError as refused:  # raised after the step's own record: what it recorded stays
            refusal = refused
        lost = transaction.get_rollback()
    if not lost:  # the pass stands: its counts (a refusal met in a lost pass is counted in the next)
        for inc in counts:
            inc()
    else:
        # A step's write raised (a held effect, a flow limit without room, an unknown credential
        # lease...): that transaction rolled back whole. Again, each step in a savepoint of its
        # own, so the steps before the refusal and the refusal's record are kept.
        refusal = None
        with transaction.atomic():
            try:
                started = start()
            except DomainError as refused:  # each step's own savepoint has kept or undone its writes
                refusal = refused
    if refusal is not None:
        raise refusal
    return started


def _start(
    *,
    worker: Worker,
    run_id: object,
    fencing_token: int,
    intent: Intent,
    credential_lease_id: object,
    reads: Collection[int] | None,
) -> Started:
    op, created = operation_intend(worker=worker, run_id=run_id, fencing_token=fencing_token, intent=intent)
    if reads is not None and op.schema_version not in reads:
        return Started(op, Phase(op.phase), created)  # the caller cannot read the record: it acts on nothing
    if op.phase in TO_AUTHORIZE:
        try:
            op = operation_authorize(
                worker=worker, operation_id=op.pk, fencing_token=fencing_token, credential_lease_id=credential_lease_id
            )
        except ApprovalRequired as asked:  # authorize moved it to PENDING_APPROVAL (or found it there)
            return Started(op, Phase.PENDING_APPROVAL, created, uuid.UUID(str(asked.approval_id)))
    if op.phase != Phase.AUTHORIZED:
        return Started(op, Phase(op.phase), created)
    terms = operation_dispatch_terms(worker=worker, operation_id=op.pk, fencing_token=fencing_token)
    op = terms.operation
    return Started(
        op, Phase(op.phase), created, dispatched=True, reservation_id=terms.reservation_id, levers=terms.levers
    )
