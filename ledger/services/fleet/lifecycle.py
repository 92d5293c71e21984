"""A worker's lifecycle, as people and the drain job change it (article "Your Agent Deploy Is
Not Safe Until In-Flight Tools Quiesce").

ACCEPTING -> DRAINING -> QUIESCED -> STOPPED, any of the first three -> QUARANTINED, and back
to ACCEPTING. A worker drains itself (its SIGTERM path) or is drained by an admin; each drain
is a ``WorkerDrain`` with the drain article's five signals. A QUIESCED worker is STOPPED when
it reports its exit or its process heartbeat lapses.
Only an ACCEPTING worker takes new leases (lease_acquire). A DRAINING worker keeps its
leases until it releases them or its deadline passes; then the deadline job revokes
them, exactly as a quarantine does at once: each held lease ends (LEASE_REVOKED), its
DISPATCHED operations become UNKNOWN with a reconciliation case, and the worker's
tokens are stale from then on. Every person's change names the user and the reason, in
the worker row, in an AdminAction, and in the chain of every run the worker holds.

Lock order, as lease_acquire: the worker row (the conditional UPDATE), then the runs.
"""

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from ledger.actors import SYSTEM_DRAIN, user_actor, worker_actor
from ledger.errors import InvalidInput, WrongPhase
from ledger.models import Operation, Run, RunLease, Worker, WorkerDrain
from ledger.roles import ADMINISTER, tenants_for
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.core.fencing import locked_runs
from ledger.services.delivery.lookup import deliveries_pending
from ledger.services.evidence.append import ChainBatch
from ledger.services.fence.lease_end import leases_end
from ledger.services.fleet.workers import worker_get
from ledger.services.lifespan.instances import instances_drain
from ledger.states import LeaseEnd, Phase, WorkerStatus

DRAIN_FROM = (WorkerStatus.ACCEPTING,)
QUARANTINE_FROM = (WorkerStatus.ACCEPTING, WorkerStatus.DRAINING, WorkerStatus.QUIESCED)
RESUME_FROM = (WorkerStatus.DRAINING, WorkerStatus.QUIESCED, WorkerStatus.QUARANTINED, WorkerStatus.STOPPED)
DEFAULT_DRAIN_S = 600
MAX_DRAIN_S = 7 * 86400


@dataclass(frozen=True)
class WorkerChange:
    """A worker whose status just changed, and the runs it held then (each got the event)."""

    worker: Worker
    affected_run_ids: list[uuid.UUID]


def _change_status(
    *,
    worker: Worker,
    allowed_from: tuple[str, ...],
    status: str,
    actor: str,
    reason: str,
    event: str,
    end_leases: bool,
    drain_deadline: datetime | None = None,
    now: datetime | None = None,
) -> WorkerChange:
    """The one place a worker's status changes: a conditional UPDATE from ``allowed_from``,
    then ``event`` (with ``reason``) in each held run's chain, ending those leases when
    ``end_leases``. The caller holds a transaction."""
    now = now or timezone.now()
    changed = Worker.objects.filter(pk=worker.pk, status__in=allowed_from).update(
        status=status,
        status_changed_at=now,
        status_changed_by=actor,
        status_reason=reason,
        drain_deadline=drain_deadline,
    )
    if changed != 1:
        current = Worker.objects.filter(pk=worker.pk).values_list("status", flat=True).get()
        raise WrongPhase(phase=current, wanted=" or ".join(allowed_from), subject="worker")
    runs = locked_runs({"worker_id": worker.pk, "owner_id__isnull": False})
    batch = ChainBatch(now)
    fields: dict[str, Any] = {"worker": worker.name, "status": status, "reason": reason}
    if drain_deadline is not None:
        fields["drain_deadline"] = drain_deadline
    if status == WorkerStatus.DRAINING and runs:
        instances_drain(runs=runs, batch=batch)  # Running -> Draining: checkpoint, then release
        fields["instance_state"] = "DRAINING"
    for run in runs:
        batch.append(run, event, actor=actor, fields=fields)
    if end_leases and runs:
        leases_end(runs=runs, batch=batch, actor=actor, end=LeaseEnd.REVOKED, reason=reason)
    batch.commit()
    worker.status, worker.status_changed_at, worker.status_changed_by = status, now, actor
    worker.status_reason, worker.drain_deadline = reason, drain_deadline
    if status == WorkerStatus.DRAINING and drain_deadline is not None:
        WorkerDrain.objects.create(
            worker=worker,
            tenant_id=worker.tenant_id,
            started_at=now,
            deadline_at=drain_deadline,
            started_by=actor,
            reason=reason,
        )
    else:
        _drain_close(worker, now, outcome=DRAIN_OUTCOMES.get(status, "released"), quiesced=runs)
    return WorkerChange(worker=worker, affected_run_ids=[run.pk for run in runs])


DRAIN_OUTCOMES: dict[str, str] = {WorkerStatus.QUARANTINED: "quarantined", WorkerStatus.ACCEPTING: "resumed"}


def _drain_close(worker: Worker, now: datetime, *, outcome: str, quiesced: list[Run]) -> None:
    """Close the worker's open drain (if any) with its last signals: when it quiesced, how
    it ended, how many effects of the worker's runs it left UNKNOWN, and how many of the
    sends it dispatched are still DEFERRED at the provider."""
    drain = WorkerDrain.objects.filter(worker=worker, quiesced_at__isnull=True).first()
    if drain is None:
        return
    unknown = Operation.objects.filter(
        phase=Phase.UNKNOWN,
        updated_at__gte=drain.started_at,
        run__lease_grants__worker=worker,
        run__lease_grants__fencing_token=F("fencing_token"),
    ).count()
    if outcome == "released" and quiesced:
        outcome = "deadline"  # it still held leases: the deadline revoked them
    WorkerDrain.objects.filter(pk=drain.pk).update(
        quiesced_at=now,
        outcome=outcome,
        unknown_count=unknown,
        deliveries_pending=deliveries_pending(worker_id=worker.pk),
    )


def _decided(
    *, worker_id: object, user: User | AnonymousUser | None, name: str, reason: object
) -> tuple[Worker, str, str]:
    reason = decision_reason(reason)
    worker = worker_get(worker_id=worker_id)
    name = acting_name(user=user, name=name, tenant_id=worker.tenant_id, perm=ADMINISTER)
    if not name:
        raise InvalidInput("a decision names who made it")
    return worker, user_actor(name), reason


@dataclass(frozen=True)
class Transition:
    allowed_from: tuple[str, ...]
    status: str
    event: str
    end_leases: bool


TRANSITIONS = {
    # No new leases; the held ones may finish until the deadline.
    "drain": Transition(DRAIN_FROM, WorkerStatus.DRAINING, "WORKER_DRAINING", end_leases=False),
    # Its leases end now (their DISPATCHED effects become UNKNOWN), its tokens are stale, it
    # gets no lease and no credential until resumed.
    "quarantine": Transition(QUARANTINE_FROM, WorkerStatus.QUARANTINED, "WORKER_QUARANTINED", end_leases=True),
    "resume": Transition(RESUME_FROM, WorkerStatus.ACCEPTING, "WORKER_RESUMED", end_leases=False),
}


def worker_change(
    *,
    worker_id: object,
    action: str,
    reason: str,
    user: User | AnonymousUser | None = None,
    name: str = "",
    deadline_s: int = DEFAULT_DRAIN_S,
) -> WorkerChange:
    """A person's decision about a worker: ``action`` is drain, quarantine or resume (see
    TRANSITIONS). The result names the changed worker and the runs it held."""
    transition = TRANSITIONS.get(action)
    if transition is None:
        raise InvalidInput(f"action must be one of {', '.join(TRANSITIONS)}")
    if action == "drain" and (type(deadline_s) is not int or not 1 <= deadline_s <= MAX_DRAIN_S):
        raise InvalidInput(f"deadline_s must be an integer from 1 to {MAX_DRAIN_S}")
    worker, actor, reason = _decided(worker_id=worker_id, user=user, name=name, reason=reason)
    with transaction.atomic():
        now = timezone.now()
        change = _change_status(
            worker=worker,
            allowed_from=transition.allowed_from,
            status=transition.status,
            actor=actor,
            reason=reason,
            event=transition.event,
            end_leases=transition.end_leases,
            drain_deadline=now + timedelta(seconds=deadline_s) if action == "drain" else None,
            now=now,
        )
        fields = {"leases_revoked": len(change.affected_run_ids)} if transition.end_leases else {}
        admin_action_record(
            tenant=worker.tenant,
            actor=actor,
            action=f"worker.{action}",
            subject=worker.name,
            reason=reason,
            fields=fields,
            now=now,
        )
    return change


def workers_drain_preview(*, worker_ids: Iterable[object], user: User | AnonymousUser) -> list[Worker]:
    """Exactly the workers a bulk drain by ``user`` will touch: those still ACCEPTING, on
    tenants the user administers, by tenant and name."""
    ids = [i for i in (_worker_id(raw) for raw in worker_ids) if i is not None]
    return list(
        Worker.objects.filter(pk__in=ids, status=WorkerStatus.ACCEPTING, tenant__in=tenants_for(user, ADMINISTER))
        .select_related("tenant")
        .order_by("tenant__slug", "name")
    )


def workers_drain_bulk(
    *,
    worker_ids: Iterable[object],
    user: User | AnonymousUser,
    reason: str,
    deadline_s: int = DEFAULT_DRAIN_S,
) -> list[WorkerChange]:
    """Drain several workers with one reason and deadline, all or none: each is
    ``worker_change``'s own drain (its event, its admin record), in one transaction; a worker
    that is no longer ACCEPTING, or not the user's to administer, changes nothing at all."""
    parsed = [_worker_id(raw) for raw in worker_ids]
    ids = sorted({i for i in parsed if i is not None})  # one order: no lock cycle between two bulk drains
    if not ids or len(ids) != len(set(parsed)):
        raise InvalidInput("choose at least one worker, by id", field="worker")
    with transaction.atomic():
        return [
            worker_change(worker_id=worker_id, action="drain", reason=reason, deadline_s=deadline_s, user=user)
            for worker_id in ids
        ]


def _worker_id(raw: object) -> int | None:
    try:
        return int(str(raw))
    except ValueError:
        return None


def worker_drain(
    *,
    worker_id: object,
    reason: str,
    deadline_s: int = DEFAULT_DRAIN_S,
    user: User | AnonymousUser | None = None,
    name: str = "",
) -> WorkerChange:
    return worker_change(
        worker_id=worker_id, action="drain", reason=reason, deadline_s=deadline_s, user=user, name=name
    )


def worker_quarantine(
    *, worker_id: object, reason: str, user: User | AnonymousUser | None = None, name: str = ""
) -> WorkerChange:
    return worker_change(worker_id=worker_id, action="quarantine", reason=reason, user=user, name=name)


def worker_resume(
    *, worker_id: object, reason: str, user: User | AnonymousUser | None = None, name: str = ""
) -> WorkerChange:
    return worker_change(worker_id=worker_id, action="resume", reason=reason, user=user, name=name)


def workers_drain_enforce(*, now: datetime | None = None) -> int:
    """The drain deadline job: a DRAINING worker that holds no live lease is QUIESCED; one
    past its deadline has its leases revoked and is QUIESCED. Idempotent. Returns how many
    workers it moved."""
    now = now or timezone.now()
    moved = 0
    live = RunLease.objects.filter(worker_id=OuterRef("pk"), owner_id__isnull=False, expires_at__gt=now)
    draining = Worker.objects.filter(status=WorkerStatus.DRAINING).annotate(holds=Exists(live)).order_by("pk")
    for worker in draining.select_related("tenant"):
        overdue = worker.drain_deadline is not None and worker.drain_deadline <= now
        holds = worker.holds
        if holds and not overdue:
            continue
        reason = "drain deadline passed" if holds else "drained: no lease left"
        try:
            with transaction.atomic():
                _change_status(
                    worker=worker,
                    allowed_from=(WorkerStatus.DRAINING,),
                    status=WorkerStatus.QUIESCED,
                    actor=SYSTEM_DRAIN,
                    reason=reason,
                    event="WORKER_QUIESCED",
                    end_leases=True,
                )
        except WrongPhase:
            continue  # resumed or quarantined meanwhile: nothing to enforce
        moved += 1
    return moved


def worker_quarantine_by_system(
    *, worker: Worker, actor: str, reason: str, now: datetime | None = None
) -> WorkerChange:
    """A quarantine no person decided (``actor`` is a ``system:`` job, e.g. the restart budget):
    the same transition as a person's, in the caller's transaction; a person resumes it."""
    return _change_status(
        worker=worker,
        allowed_from=QUARANTINE_FROM,
        status=WorkerStatus.QUARANTINED,
        actor=actor,
        reason=reason,
        event="WORKER_QUARANTINED",
        end_leases=True,
        now=now,
    )


def worker_drain_self(*, worker: Worker, deadline_s: int, reason: str = "") -> WorkerChange:
    """The worker drains itself (its SIGTERM handler): ACCEPTING -> DRAINING until now +
    ``deadline_s``. Draining again changes nothing and returns the worker as it is."""
    if type(deadline_s) is not int or not 1 <= deadline_s <= MAX_DRAIN_S:
        raise InvalidInput(f"deadline_s must be an integer from 1 to {MAX_DRAIN_S}", field="deadline_s")
    reason = decision_reason(reason or "the worker is shutting down")
    if worker.status == WorkerStatus.DRAINING:
        return WorkerChange(worker=worker, affected_run_ids=[])
    with transaction.atomic():
        now = timezone.now()
        change = _change_status(
            worker=worker,
            allowed_from=DRAIN_FROM,
            status=WorkerStatus.DRAINING,
            actor=worker_actor(worker, "-"),
            reason=reason,
            event="WORKER_DRAINING",
            end_leases=False,
            drain_deadline=now + timedelta(seconds=deadline_s),
            now=now,
        )
    return change


def worker_exit(*, worker: Worker) -> Worker:
    """The worker reports its exit: a QUIESCED worker is STOPPED; a DRAINING one that holds
    no live lease quiesces first. A worker still holding leases cannot exit this way (409)."""
    now = timezone.now()
    with transaction.atomic():
        worker.status = Worker.objects.select_for_update().values_list("status", flat=True).get(pk=worker.pk)
        if worker.status == WorkerStatus.DRAINING:  # read under the lock: the drain job may have quiesced it
            holds = RunLease.objects.filter(worker=worker, owner_id__isnull=False, expires_at__gt=now).exists()
            if holds:
                raise WrongPhase(
                    phase="DRAINING with live leases", wanted="QUIESCED (release the leases first)", subject="worker"
                )
            _change_status(
                worker=worker,
                allowed_from=(WorkerStatus.DRAINING,),
                status=WorkerStatus.QUIESCED,
                actor=worker_actor(worker, "-"),
                reason="drained: no lease left",
                event="WORKER_QUIESCED",
                end_leases=True,
                now=now,
            )
        worker_stopped(worker, now, reason="the worker reported its exit")
    return worker


def worker_stopped(worker: Worker, now: datetime, *, reason: str) -> None:
    """QUIESCED -> STOPPED (in the caller's transaction), closing its drain record."""
    changed = Worker.objects.filter(pk=worker.pk, status=WorkerStatus.QUIESCED).update(
        status=WorkerStatus.STOPPED, status_changed_at=now, status_changed_by=SYSTEM_DRAIN, status_reason=reason
    )
    if changed != 1:
        current = Worker.objects.filter(pk=worker.pk).values_list("status", flat=True).get()
        raise WrongPhase(phase=current, wanted=WorkerStatus.QUIESCED, subject="worker")
    WorkerDrain.objects.filter(worker=worker, stopped_at__isnull=True, quiesced_at__isnull=False).update(stopped_at=now)
    worker.status, worker.status_changed_at, worker.status_reason = WorkerStatus.STOPPED, now, reason


def worker_heartbeat(*, worker: Worker) -> Worker:
    """The worker's process is alive (apart from any lease it holds)."""
    now = timezone.now()
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=now, last_seen_at=now)
    worker.last_heartbeat_at = worker.last_seen_at = now
    return worker


def workers_stop_lapsed(*, lapse_s: int, now: datetime | None = None) -> int:
    """QUIESCED workers whose process heartbeat lapsed (none for ``lapse_s``) are STOPPED."""
    now = now or timezone.now()
    stopped = 0
    cutoff = now - timedelta(seconds=lapse_s)
    quiet = Worker.objects.filter(status=WorkerStatus.QUIESCED).filter(
        Q(last_heartbeat_at__lt=cutoff) | Q(last_heartbeat_at__isnull=True, status_changed_at__lt=cutoff)
    )
    for worker in quiet.order_by("pk"):
        try:
            with transaction.atomic():
                worker_stopped(worker, now, reason="its process heartbeat lapsed")
        except WrongPhase:
            continue
        stopped += 1
    return stopped
