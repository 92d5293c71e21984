"""StateConflicts: a record whose two representations disagree during an upgrade window.

Opening one (a reader or the backfill saw the disagreement) locks the record's run, checks
the disagreement again under that lock, records the conflict, counts it on the run (its
fenced calls and leases are refused with 409 STATE_CONFLICT while the count is above zero)
and appends STATE_CONFLICT_OPENED to the run's chain. Only a person closes one: they choose
which representation is right ("old" or "new"), with a reason; both are then written from
that choice, the run's count goes down and STATE_CONFLICT_RESOLVED names them. Nothing
closes a conflict by default, and automation on other runs goes on."""

import uuid

from django.contrib.auth.models import AnonymousUser, User
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from ledger.actors import user_actor
from ledger.errors import InvalidInput, NotFound, WrongPhase
from ledger.models import Operation, Run, StateConflict
from ledger.roles import OPERATE
from ledger.services.core.decisions import acting_name, decision_reason
from ledger.services.core.fencing import locked_runs
from ledger.services.evidence.append import ChainBatch
from ledger.services.upgrades import provider_ref
from ledger.services.upgrades.phases import phase
from ledger.states import ConflictStatus

SYSTEM = "system:upgrade"
CHOICES = ("old", "new")


def _locked_run(run_id: uuid.UUID | str) -> Run:
    runs = locked_runs({"run_id": run_id})
    if runs:
        return runs[0]
    run = Run.objects.select_for_update().get(pk=run_id)  # a run never leased has no lease row
    return run


def conflict_open(*, operation_id: uuid.UUID | str, found_by: str) -> StateConflict | None:
    """Record the disagreement of operation ``operation_id`` as an open StateConflict (or
    return the one already open); None when, under the run's lock, it agrees after all."""
    op = Operation.objects.filter(pk=operation_id).only("pk", "run_id").first()
    if op is None:
        raise NotFound("operation not found")
    record = f"operation:{op.pk}"
    with transaction.atomic():
        run = _locked_run(op.run_id)
        op = Operation.objects.get(pk=op.pk)
        seen = provider_ref.disagreement(op, phase(provider_ref.CHANGE))
        if seen is None:
            return None
        old, new = seen
        now = timezone.now()
        try:
            with transaction.atomic():
                conflict = StateConflict.objects.create(
                    tenant_id=run.tenant_id,
                    run=run,
                    change=provider_ref.CHANGE,
                    record=record,
                    old_value=old,
                    new_value=new,
                    found_by=found_by[:100],
                    found_at=now,
                )
        except IntegrityError:  # already open (conflict_open_per_record)
            return StateConflict.objects.get(change=provider_ref.CHANGE, record=record, status=ConflictStatus.OPEN)
        Run.objects.filter(pk=run.pk).update(open_conflicts=F("open_conflicts") + 1)
        batch = ChainBatch(now)
        batch.append(
            run,
            "STATE_CONFLICT_OPENED",
            actor=SYSTEM,
            fields={
                "conflict_id": conflict.pk,
                "change": provider_ref.CHANGE,
                "record": record,
                "old": old,
                "new": new,
                "found_by": found_by,
            },
        )
        batch.commit()
    return conflict


def conflicts_open(found: list[provider_ref.Conflict], *, found_by: str) -> int:
    """Open a conflict for each (operation id, run id, old, new) a backfill batch found;
    how many are newly open."""
    opened = 0
    for op_id, _run_id, _old, _new in found:
        before = StateConflict.objects.filter(record=f"operation:{op_id}", status=ConflictStatus.OPEN).exists()
        if conflict_open(operation_id=op_id, found_by=found_by) is not None and not before:
            opened += 1
    return opened


def conflict_resolve(*, conflict_id: object, user: User | AnonymousUser, choice: str, reason: object) -> StateConflict:
    """A person decides which representation is right: "old" (the provider_request_id) or
    "new" (the provider_ref). Both are written from that choice; the conflict is RESOLVED."""
    if choice not in CHOICES:
        raise InvalidInput('choice must be "old" or "new": which representation is right', field="choice")
    why = decision_reason(reason)
    conflict = StateConflict.objects.filter(pk=int(str(conflict_id))).first() if str(conflict_id).isdigit() else None
    if conflict is None:
        raise NotFound("state conflict not found")
    name = acting_name(user=user, name="", tenant_id=conflict.tenant_id, perm=OPERATE)
    op_id = conflict.record.removeprefix("operation:")
    with transaction.atomic():
        run = _locked_run(conflict.run_id)
        if (
            StateConflict.objects.filter(pk=conflict.pk, status=ConflictStatus.OPEN).update(
                status=ConflictStatus.RESOLVED,
                resolved_at=timezone.now(),
                resolved_by=name,
                resolution=choice,
                reason=why,
            )
            != 1
        ):
            raise WrongPhase(phase="RESOLVED", wanted=ConflictStatus.OPEN)
        op = Operation.objects.get(pk=op_id)
        if choice == "old":
            ref = provider_ref.legacy(op.provider, op.provider_request_id)
        else:
            try:
                ref = provider_ref.parsed(op.provider_ref)
            except InvalidInput:
                raise InvalidInput(
                    "the new representation is not a valid provider_ref: choose old", field="choice"
                ) from None
        values = {
            "provider_ref": ref.as_json() if ref is not None else None,
            "provider_request_id": ref.id if ref else "",
        }
        Operation.objects.filter(pk=op.pk).update(**values)
        Run.objects.filter(pk=run.pk).update(open_conflicts=F("open_conflicts") - 1)
        batch = ChainBatch(timezone.now())
        batch.append(
            run,
            "STATE_CONFLICT_RESOLVED",
            actor=user_actor(name),
            fields={"conflict_id": conflict.pk, "record": conflict.record, "choice": choice, "reason": why},
        )
        batch.commit()
    conflict.refresh_from_db()
    return conflict
