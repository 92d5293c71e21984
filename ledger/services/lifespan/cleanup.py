"""An admin's decisions about a resource whose cleanup is stuck: "retry cleanup now" (the
next reaper pass calls its driver again, without waiting for the backoff) and "mark
released" (a person checked that it is gone; the only way to RELEASED without a driver's
word). Each names the person and the reason, in the run's chain and an AdminAction."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from ledger.actors import user_actor
from ledger.errors import InvalidInput, NotFound, WrongPhase, parse_id
from ledger.models import ResourceAlert, Run, RunResource, Tenant
from ledger.roles import ADMINISTER
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.core.fencing import lock_run
from ledger.services.evidence.append import ChainBatch
from ledger.states import RESOURCE_CLAIMABLE, RESOURCE_MARKABLE, ResourceState

RETRYABLE = RESOURCE_CLAIMABLE  # the reaper's next pass calls the driver again
MARKABLE = RESOURCE_MARKABLE


@dataclass
class Decision:
    resource: RunResource
    run: Run
    batch: ChainBatch
    actor: str
    reason: str
    now: datetime


@contextmanager
def _decision(
    *,
    tenant: Tenant,
    resource_id: object,
    user: User | AnonymousUser | None,
    name: str,
    reason: object,
    allowed: tuple[str, ...],
    action: str,
) -> Iterator[Decision]:
    """The person, the reason and the locked run and resource of one decision; the body's
    events commit with the AdminAction, or nothing does."""
    reason = decision_reason(reason)
    name = acting_name(user=user, name=name, tenant_id=tenant.pk, perm=ADMINISTER)
    if not name:
        raise InvalidInput("a decision names who made it")
    actor = user_actor(name)
    with transaction.atomic():
        pk = parse_id(resource_id, "resource")
        run_id = RunResource.objects.filter(tenant=tenant, pk=pk).values_list("run_id", flat=True).first()
        if run_id is None:
            raise NotFound("resource not found")
        run = lock_run(tenant=tenant, run_id=run_id)
        resource = RunResource.objects.select_for_update(of=("self",)).get(pk=pk)
        if resource.state not in allowed:
            raise WrongPhase(phase=resource.state, wanted=" or ".join(allowed), subject="resource")
        now = timezone.now()
        batch = ChainBatch(now)
        yield Decision(resource=resource, run=run, batch=batch, actor=actor, reason=reason, now=now)
        batch.commit()
        admin_action_record(
            tenant=tenant, actor=actor, action=action, subject=f"{resource.kind} {resource.pk}", reason=reason, now=now
        )


def resource_retry_now(
    *,
    tenant: Tenant,
    resource_id: object,
    reason: object,
    user: User | AnonymousUser | None = None,
    name: str = "",
) -> RunResource:
    with _decision(
        tenant=tenant,
        resource_id=resource_id,
        user=user,
        name=name,
        reason=reason,
        allowed=RETRYABLE,
        action="resource.retry",
    ) as d:
        RunResource.objects.filter(pk=d.resource.pk).update(next_attempt_at=d.now)
        d.resource.next_attempt_at = d.now
        d.batch.append(
            d.run, "RESOURCE_RETRY_REQUESTED", actor=d.actor, fields={"resource_id": d.resource.pk, "reason": d.reason}
        )
    return d.resource


def resource_mark_released(
    *,
    tenant: Tenant,
    resource_id: object,
    reason: object,
    user: User | AnonymousUser | None = None,
    name: str = "",
) -> RunResource:
    with _decision(
        tenant=tenant,
        resource_id=resource_id,
        user=user,
        name=name,
        reason=reason,
        allowed=MARKABLE,
        action="resource.mark_released",
    ) as d:
        RunResource.objects.filter(pk=d.resource.pk).update(
            state=ResourceState.RELEASED, released_at=d.now, released_by=d.actor, claimed_by="", claim_expires_at=None
        )
        ResourceAlert.objects.filter(resource=d.resource, cleared_at__isnull=True).update(cleared_at=d.now)
        d.resource.state, d.resource.released_at, d.resource.released_by = ResourceState.RELEASED, d.now, d.actor
        d.batch.append(
            d.run,
            "RESOURCE_MARKED_RELEASED",
            actor=d.actor,
            fields={
                "resource_id": d.resource.pk,
                "kind": d.resource.kind,
                "reason": d.reason,
                "attempts": d.resource.attempts,
            },
        )
    return d.resource
