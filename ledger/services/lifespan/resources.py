"""The resource registry: what each run holds outside Fenceline (article "Agent Lifespan
Management": "Records sessions, connections, temporary objects, and credentials associated
with each run").

A worker attaches a resource under the fence, counted against the run's resource quota
(``policy.quotas.resources_per_run``, counted under the run's lock), and asks for its
release under the fence. Nobody but the resource reaper (``reaper.py``) marks a resource
RELEASED, and only once the driver of its kind confirmed it closed (or an admin decided it
is gone). A run's end — completion, cancel, timeout, lease loss, drain — hands every ACTIVE
resource of the run to the reaper (``resources_request_release``).

A handle is a reference (a session id, a sandbox name), never a secret: it passes the
secret boundary, and one live (provider, handle) exists across all tenants, so a session
live in one tenant or run cannot be attached by another.
"""

import re
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction

from ledger.boundary import check_text
from ledger.errors import Denied, DomainError, InvalidInput
from ledger.models import LeaseGrant, Run, RunResource, Worker
from ledger.policy import quotas_of, resource_limit
from ledger.services.authority.policy import policy_current
from ledger.services.core.fencing import Fenced, fenced, refuse_new_work
from ledger.services.evidence.append import ChainBatch
from ledger.states import RESOURCE_OPEN, ResourceKind, ResourceState

PROVIDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,99}$")
MAX_HANDLE_LENGTH = 500


class ResourceInUse(DomainError):
    """The (provider, handle) is live in another run (of this tenant or another one)."""

    code = "RESOURCE_IN_USE"
    status = 409


@dataclass(frozen=True)
class Attach:
    kind: str
    provider: str
    handle: str
    ttl_s: int | None = None
    idle_s: int | None = None


def _checked(attach: Attach, policy: dict[str, Any]) -> tuple[ResourceKind, int]:
    if attach.kind not in ResourceKind.values:
        raise InvalidInput(f"kind must be one of {', '.join(ResourceKind.values)}", field="kind")
    if not isinstance(attach.provider, str) or not PROVIDER.match(attach.provider):
        raise InvalidInput("provider must be 1 to 100 letters, digits and _ . : -", field="provider")
    check_text(attach.provider, path="provider")  # stored and in the chain: an API key fits the pattern
    if not isinstance(attach.handle, str) or not 1 <= len(attach.handle) <= MAX_HANDLE_LENGTH:
        raise InvalidInput(f"handle must be 1 to {MAX_HANDLE_LENGTH} characters", field="handle")
    check_text(attach.handle, path="handle")
    max_age = quotas_of(policy)["resource_max_age_s"]
    for name in ("ttl_s", "idle_s"):
        value = getattr(attach, name)
        if value is not None and (type(value) is not int or value < 1):
            raise InvalidInput(f"{name} must be a positive integer", field=name)
        if value is not None and value > max_age:
            raise Denied(
                "DENY_POLICY", f"the policy allows a resource at most {max_age} s (resource_max_age_s)", field=name
            )
    return ResourceKind(attach.kind), attach.ttl_s or max_age


def resource_attach(*, worker: Worker, run_id: object, fencing_token: int, attach: Attach) -> tuple[RunResource, bool]:
    """Register a resource the run now holds; returns ``(resource, created)``. Attaching
    the same live handle to the same run again returns it unchanged (200); a handle live
    elsewhere is 409 RESOURCE_IN_USE; past the quota, 403 DENY_QUOTA."""
    _, policy = policy_current(tenant=worker.tenant)
    kind, ttl_s = _checked(attach, policy)

    def write(ctx: Fenced) -> tuple[RunResource, bool]:
        refuse_new_work(ctx.run)
        found = _live(attach, run=ctx.run, kind=kind)
        if found is not None:
            return found, False
        _within_quota(policy, run=ctx.run, kind=kind)
        instance = LeaseGrant.objects.filter(run_id=ctx.run.pk, fencing_token=ctx.fencing_token).values_list(
            "pk", flat=True
        )
        resource = RunResource(
            tenant_id=ctx.run.tenant_id,
            run=ctx.run,
            instance_id=instance.get(),
            kind=kind,
            provider=attach.provider,
            handle=attach.handle,
            created_at=ctx.now,
            idle_s=attach.idle_s,
            expires_at=ctx.now + timedelta(seconds=ttl_s),
        )
        try:
            with transaction.atomic():
                resource.save(force_insert=True)
        except IntegrityError:  # the same handle was attached elsewhere at this moment
            raise ResourceInUse("this handle is live in another run; release it there first", field="handle") from None
        ctx.run.n_resources += 1  # written with the chain head
        ctx.batch.append(
            ctx.run,
            "RESOURCE_ATTACHED",
            actor=ctx.actor,
            fields={
                "resource_id": resource.pk,
                "kind": kind.value,
                "provider": resource.provider,
                "handle": resource.handle,
                "expires_at": resource.expires_at,
                "idle_s": resource.idle_s,
                "fencing_token": ctx.fencing_token,
            },
        )
        return resource, True

    return fenced(worker=worker, run_id=run_id, fencing_token=fencing_token, attempted="resource.attach", write=write)


def _live(attach: Attach, *, run: Run, kind: ResourceKind) -> RunResource | None:
    """The live resource of ``attach``'s (provider, handle) when it is this run's, of this
    kind and ACTIVE (attached again: unchanged); 409 RESOURCE_IN_USE when it is live
    anywhere else; None when it is not live."""
    existing = RunResource.objects.filter(provider=attach.provider, handle=attach.handle).exclude(
        state=ResourceState.RELEASED
    )
    found = existing.first()
    if found is None:
        return None
    if found.run_id == run.pk and found.kind == kind and found.state == ResourceState.ACTIVE:
        return found
    raise ResourceInUse("this handle is live in another run; release it there first", field="handle")


def _within_quota(policy: dict[str, Any], *, run: Run, kind: ResourceKind) -> None:
    """403 DENY_QUOTA when the run's open resources of ``kind`` fill its quota (counted
    under the run's lock)."""
    limit = resource_limit(policy, kind)
    if limit is None:
        return
    use = RunResource.objects.filter(run=run, kind=kind, state__in=RESOURCE_OPEN).count()
    if use >= limit:
        raise Denied(
            "DENY_QUOTA",
            f"quota resources_per_run.{kind} is full: {use} of {limit} in use",
            quota=f"resources_per_run.{kind}",
            limit=limit,
            use=use,
        )


def resource_release(*, worker: Worker, resource_id: object, fencing_token: int) -> RunResource:
    """The run's lease owner is done with a resource: ACTIVE -> RELEASE_REQUESTED. The
    reaper closes it through its driver and only then marks it RELEASED. Asking again, or
    for a resource already on its way out, changes nothing."""
    resource = RunResource.objects.of_tenant(worker.tenant_id, resource_id)

    def write(ctx: Fenced) -> RunResource:
        current = RunResource.objects.select_for_update(of=("self",)).get(pk=resource.pk)
        if current.state == ResourceState.ACTIVE:
            resources_request({ctx.run: [current.pk]}, ctx.batch, ctx.actor, "worker")
            current.refresh_from_db()
        return current

    return fenced(
        worker=worker, run_id=resource.run_id, fencing_token=fencing_token, attempted="resource.release", write=write
    )


def resources_request(
    runs_ids: dict[Run, list[uuid.UUID]],
    batch: ChainBatch,
    actor: str,
    reason: str,
    *,
    claim: dict[str, Any] | None = None,
) -> int:
    """ACTIVE -> RELEASE_REQUESTED for {run: [resource ids]} of locked runs: one UPDATE, one
    event per run. (A resource leaves ACTIVE only under its run's lock, so the ids are current.)

    With ``claim`` (the reaper's claim fields), the same UPDATE goes on to RELEASING under
    that claim: the reaper asks for and claims an overdue resource at once, and the row
    never rests in RELEASE_REQUESTED (one write instead of two)."""
    ids = [pk for pks in runs_ids.values() for pk in pks]
    if not ids:
        return 0
    moved = RunResource.objects.filter(pk__in=ids, state=ResourceState.ACTIVE).update(
        state=ResourceState.RELEASE_REQUESTED if claim is None else ResourceState.RELEASING,
        release_requested_at=batch.now,
        release_reason=reason,
        next_attempt_at=batch.now,
        **(claim or {}),
    )
    if moved != len(ids):
        raise AssertionError("a resource left ACTIVE without its run's lock")
    batch.append_many(
        [
            (run, {"resource_ids": [str(pk) for pk in pks[:50]], "count": len(pks), "reason": reason})
            for run, pks in runs_ids.items()
        ],
        "RESOURCE_RELEASE_REQUESTED",
        actor=actor,
    )
    return moved


def resources_request_release(*, runs: list[Run], batch: ChainBatch, actor: str, reason: str) -> int:
    """Hand every ACTIVE resource of the locked ``runs`` to the reaper, with one event per
    run that had any. No read for runs that never attached one (``Run.n_resources``)."""
    by_pk = {run.pk: run for run in runs if run.n_resources}
    by_run: dict[Run, list[uuid.UUID]] = {}
    if not by_pk:
        return 0
    for run_id, pk in RunResource.objects.filter(run_id__in=list(by_pk), state=ResourceState.ACTIVE).values_list(
        "run_id", "pk"
    ):
        by_run.setdefault(by_pk[run_id], []).append(pk)
    return resources_request(by_run, batch, actor, reason)
