"""The resource reaper: an independent controller that closes what runs left behind (article
"Agent Lifespan Management": "Run cleanup independently from workers"; its failure
"Cleanup repeatedly fails": "Retry independently and alert with resource ownership
details").

One pass (``resources_reap``, run by beat and by ``manage.py reap_resources``):

1. **Overdue.** ACTIVE resources past their lifetime (``expires_at``) or idle deadline (no
   progress of their run for ``idle_s``) are asked for release and claimed for this pass
   in one UPDATE, under their runs' locks (taken with SKIP LOCKED: a run being written to
   waits for the next pass), each batch closed and settled (3, 4) before the next.
2. **Claim.** Then due releases (asked for by workers and lease ends) and retries — and
   claims whose reaper died — are claimed set-based with ``FOR UPDATE SKIP LOCKED`` and
   moved to RELEASING under the batch's claim (its id and expiry), in a short transaction
   of their own. Two reapers at once claim disjoint sets; a reaper killed after its claim
   leaves RELEASING rows that the next pass claims again once the claim expired.
3. **Close.** Each claimed resource goes to the driver of its kind (``drivers.py``), a few
   at a time, each call bounded by a timeout (a hung call is abandoned as FAILED).
4. **Settle.** Under the runs' locks, and only for rows still under the batch's claim:
   CLOSED / ALREADY_GONE -> RELEASED (the only way to RELEASED besides an admin's
   decision); FAILED -> CLEANUP_FAILED with exponential backoff and jitter. After
   ``RESOURCE_ALERT_AFTER_FAILURES`` failures, or once past its deadline, a resource raises
   an alert that carries who owns it.
5. **Instances.** EXPIRED instances go on to REAPING, and REAPING ones to RELEASED once no
   resource of theirs is open (cleanup verified). An EXPIRED instance that never held a
   resource has nothing to verify: it goes to RELEASED (through REAPING) in one event that
   names both states.

Nothing here touches a credential lease: its expiry is its own, and never waits for cleanup.
"""

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from queue import Empty, SimpleQueue
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, QuerySet, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ledger.actors import SYSTEM_RESOURCE_REAPER
from ledger.boundary import credential_kind
from ledger.models import LeaseGrant, ResourceAlert, Run, RunResource
from ledger.pagination import past
from ledger.services.core.fencing import runs_locked_for_sweep
from ledger.services.evidence.append import ChainBatch, json_safe
from ledger.services.lifespan.drivers import Closed, Closing, ResourceRef, driver_for
from ledger.services.lifespan.resources import resources_request
from ledger.sql import lifespan as sql_lifespan
from ledger.states import RESOURCE_CLAIMABLE, InstanceState, ResourceState

log = logging.getLogger("fenceline.reaper")


@dataclass
class ResourceReapResult:
    requested: int = 0  # ACTIVE resources past a deadline, asked for release
    released: int = 0  # RELEASED: the driver confirmed
    failed: int = 0  # driver calls that failed or timed out
    alerts: int = 0  # alerts raised
    instances_released: int = 0
    batches: int = 0
    seconds: float = 0.0


def _option(name: str) -> int:
    return int(settings.FENCELINE[name])


# --- claims ---------------------------------------------------------------------------


@dataclass
class _Claim:
    """One batch's claim on resources: its id (each row's ``claimed_by``) and expiry, and
    once read back (:meth:`read`), the references the drivers are given and the run of
    each (by resource id). The rows still under it are those a stale claim's takeover
    (another reaper, once it expired) has not taken."""

    id: str
    expires_at: datetime
    refs: list[ResourceRef] = field(default_factory=list)
    run_of: dict[str, uuid.UUID] = field(default_factory=dict)

    @classmethod
    def new(cls, now: datetime) -> "_Claim":
        claim_s = _option("RESOURCE_CLOSE_TIMEOUT_S") * 3 + 30
        return cls(uuid.uuid4().hex, now + timedelta(seconds=claim_s))

    def fields(self) -> dict[str, Any]:
        """What the claim writes on a resource's row, beside state RELEASING."""
        return {"claimed_by": self.id, "claim_expires_at": self.expires_at, "attempts": F("attempts") + 1}

    def rows(self) -> QuerySet[RunResource]:
        """The rows still under this claim (along the ``resource_claimed`` index)."""
        return RunResource.objects.filter(
            state=ResourceState.RELEASING, claim_expires_at=self.expires_at, claimed_by=self.id
        )

    def read(self) -> None:
        rows = self.rows().values_list("pk", "kind", "provider", "handle", "attempts", "run_id")
        for pk, kind, provider, handle, attempts, run_id in rows:
            self.refs.append(ResourceRef(str(pk), kind, provider, handle, attempts))
            self.run_of[str(pk)] = run_id


# --- 1. overdue -----------------------------------------------------------------------

# An overdue resource as read: (run id, resource id, expires_at).
type _Overdue = tuple[uuid.UUID, uuid.UUID, datetime]


def _idle_due() -> "ExpressionWrapper[CombinedExpression]":  # generic only to the type checker
    """When an ACTIVE resource with idle_s is idle-overdue: idle_s after the later of its
    creation and its run's last progress."""
    since = Greatest(F("created_at"), Coalesce(F("run__last_progress_at"), F("created_at")))
    idle = ExpressionWrapper(F("idle_s") * Value(timedelta(seconds=1)), output_field=DurationField())
    return ExpressionWrapper(since + idle, output_field=DateTimeField())


def _idle_overdue(idle: QuerySet[RunResource], now: datetime, limit: int) -> list[_Overdue]:
    """(run_id, pk, expires_at) of idle-overdue resources."""
    return list(
        idle.annotate(idle_due=_idle_due()).filter(idle_due__lte=now).values_list("run_id", "pk", "expires_at")[:limit]
    )


# A batch of the overdue step claims at most this many times its size: every overdue
# resource of the runs it locked, so that a run gets one RESOURCE_RELEASE_REQUESTED event
# per pass and reason rather than one per batch its resources were read in.
BATCH_SPREAD = 10


def _overdue_of(
    run_ids: list[uuid.UUID], now: datetime, limit: int
) -> tuple[dict[str, dict[uuid.UUID, list[uuid.UUID]]], bool]:
    """The overdue ACTIVE resources of the locked runs ``run_ids`` (at most ``limit``), by
    reason and run id, and whether the limit cut the reads. Read under the runs' locks: a
    resource leaves ACTIVE only under its run's lock, and a run's progress is written
    under it, so what another reaper or the run's worker did since the first read is seen."""
    active = RunResource.objects.filter(run_id__in=run_ids, state=ResourceState.ACTIVE)
    by_reason: dict[str, dict[uuid.UUID, list[uuid.UUID]]] = {}
    rows = list(active.filter(expires_at__lte=now).values_list("run_id", "pk", "expires_at")[:limit])
    if len(rows) < limit:
        rows += _idle_overdue(active.filter(idle_s__isnull=False, expires_at__gt=now), now, limit - len(rows))
    for run_id, pk, expires_at in rows:
        reason = "deadline" if expires_at <= now else "idle"
        by_reason.setdefault(reason, {}).setdefault(run_id, []).append(pk)
    return by_reason, len(rows) == limit


def _overdue_claims(batch_size: int, result: ResourceReapResult) -> Iterator[_Claim]:
    """Ask for the release of ACTIVE resources past a deadline and claim them for this pass
    in the same UPDATE (ACTIVE -> RELEASING through RELEASE_REQUESTED, both recorded by the
    run's RESOURCE_RELEASE_REQUESTED event), batch by batch: each batch's claims, once
    committed. A batch is the runs of ``batch_size`` overdue resources, with every overdue
    resource of theirs (up to ``BATCH_SPREAD`` times ``batch_size``).

    When every run of a batch is busy elsewhere (another copy of the reaper has them:
    ``reap_resources --processes N``), the next reads leave those runs out instead of
    ending the step, so copies at once split it; a resource left out is asked for by the
    copy that holds its run, or by the next pass."""
    busy: set[uuid.UUID] = set()  # runs found locked by another copy in a batch of nothing else
    while True:
        with transaction.atomic():
            now = timezone.now()
            # Two reads, each along its own index: past the lifetime, then idle-overdue.
            active = RunResource.objects.filter(state=ResourceState.ACTIVE)
            if busy:
                active = active.exclude(run_id__in=busy)
            rows = list(active.filter(expires_at__lte=now).values_list("run_id", "pk", "expires_at")[:batch_size])
            if len(rows) < batch_size:
                rows += _idle_overdue(
                    active.filter(idle_s__isnull=False, expires_at__gt=now), now, batch_size - len(rows)
                )
            if not rows:
                return
            runs = {run.pk: run for run in runs_locked_for_sweep(run_ids={r[0] for r in rows})}
            by_reason, cut = _overdue_of(list(runs), now, BATCH_SPREAD * batch_size)
            batch = ChainBatch(now)
            claim = _Claim.new(now)
            for reason, by_run in by_reason.items():  # one UPDATE per reason
                ids = {runs[run_id]: pks for run_id, pks in by_run.items()}
                result.requested += resources_request(ids, batch, SYSTEM_RESOURCE_REAPER, reason, claim=claim.fields())
            if by_reason:
                claim.read()
            batch.commit()
        if claim.refs:
            yield claim
        if len(rows) < batch_size and not cut:
            return
        if not by_reason:  # these runs are busy elsewhere: read on without them
            busy.update(run_id for run_id, _, _ in rows if run_id not in runs)


# --- 2. claim -------------------------------------------------------------------------


def _claim(batch_size: int) -> _Claim:
    """Claim up to ``batch_size`` due resources for this pass."""
    with transaction.atomic():
        now = timezone.now()
        claim = _Claim.new(now)
        due = RunResource.objects.filter(state__in=RESOURCE_CLAIMABLE, next_attempt_at__lte=now).order_by(
            "next_attempt_at"
        )
        ids = list(due.select_for_update(skip_locked=True).values_list("pk", flat=True)[:batch_size])
        if len(ids) < batch_size:  # claims whose reaper died before it settled them
            stale = RunResource.objects.filter(state=ResourceState.RELEASING, claim_expires_at__lte=now)
            ids += list(stale.select_for_update(skip_locked=True).values_list("pk", flat=True)[: batch_size - len(ids)])
        if ids:
            RunResource.objects.filter(pk__in=ids).update(state=ResourceState.RELEASING, **claim.fields())
            claim.read()
        return claim


# --- 3. close -------------------------------------------------------------------------


class _Calls:
    """The driver calls of one batch. A few callers (threads of a pool) take the resources
    one at a time, so a call costs no task of its own; each call's start is noted, so that
    the batch can give up on one that runs too long. Each resource is answered once: by its
    driver, or by the timeout, whichever comes first."""

    def __init__(self, refs: list[ResourceRef]) -> None:
        self.todo: SimpleQueue[ResourceRef] = SimpleQueue()
        for ref in refs:
            self.todo.put(ref)
        self.answers: dict[str, tuple[ResourceRef, str, Closing]] = {}
        self.running: dict[str, tuple[ResourceRef, str, float]] = {}  # resource id -> (ref, driver, start)
        self.lock = threading.Lock()
        self.answered = threading.Event()

    def caller(self) -> None:
        while True:
            try:
                ref = self.todo.get_nowait()
            except Empty:
                return
            driver = driver_for(ref.kind, ref.provider)
            with self.lock:
                self.running[ref.resource_id] = (ref, driver.name, time.monotonic())
            try:
                closing = driver.close(ref)
            except Exception as exc:  # a driver's bug is a failed close, not a dead reaper
                closing = Closing(Closed.FAILED, f"{type(exc).__name__} in driver {driver.name}")
            with self.lock:
                if self.running.pop(ref.resource_id, None) is None:
                    continue  # given up on while it ran (answered FAILED): on to the next
                self.answers[ref.resource_id] = (ref, driver.name, closing)
            self.answered.set()

    def give_up_past(self, timeout: float) -> None:
        """Answer FAILED for each call running longer than ``timeout`` seconds."""
        now = time.monotonic()
        with self.lock:
            for resource_id, (ref, driver, started) in list(self.running.items()):
                if now - started > timeout:
                    del self.running[resource_id]
                    self.answers[resource_id] = (
                        ref,
                        driver,
                        Closing(Closed.FAILED, f"driver {driver} timed out after {timeout} s"),
                    )


def _close_all(refs: list[ResourceRef]) -> list[tuple[ResourceRef, str, Closing]]:
    """Close each resource through its driver, at most RESOURCE_CLOSE_CONCURRENCY at once;
    a call running longer than RESOURCE_CLOSE_TIMEOUT_S is given up as FAILED (its thread
    is left to finish on its own: a driver must return eventually)."""
    if not refs:
        return []
    timeout = _option("RESOURCE_CLOSE_TIMEOUT_S")
    callers = min(_option("RESOURCE_CLOSE_CONCURRENCY"), len(refs))
    calls = _Calls(refs)
    pool = ThreadPoolExecutor(max_workers=callers, thread_name_prefix="reaper")
    for _ in range(callers):
        pool.submit(calls.caller)
    while True:  # back on each answer, or to look at the timeouts again
        calls.answered.clear()
        calls.give_up_past(timeout)
        if len(calls.answers) == len(refs):
            break
        calls.answered.wait(0.05)
    pool.shutdown(wait=False)
    with calls.lock:
        return list(calls.answers.values())


# --- 4. settle ------------------------------------------------------------------------


def failure_text(detail: str) -> str:
    """A driver's word on a failure, as it is kept and shown: at most 300 characters, and
    withheld if it looks like a credential (a driver may echo what its provider said)."""
    detail = (detail or "failed")[:300]
    return "(withheld: the driver's message looked like a credential)" if credential_kind(detail) else detail


def backoff_s(attempts: int) -> float:
    """Exponential backoff with full jitter between half and all of the step."""
    step: int = min(_option("RESOURCE_BACKOFF_MAX_S"), _option("RESOURCE_BACKOFF_BASE_S") * 2 ** max(attempts - 1, 0))
    return step * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret


def _ownership(resource: RunResource) -> dict[str, Any]:
    instance = resource.instance
    return json_safe(
        {
            "tenant": resource.tenant.slug,
            "run_id": resource.run_id,
            "instance": {"fencing_token": instance.fencing_token, "owner_id": instance.owner_id},
            "worker": instance.worker.name,
            "kind": resource.kind,
            "provider": resource.provider,
            "handle": resource.handle,
            "first_failed_at": resource.first_failed_at,
            "attempts": resource.attempts,
            "last_error": resource.last_error,
            "expires_at": resource.expires_at,
        }
    )


def alert_raise(resource: RunResource, reason: str, now: datetime) -> ResourceAlert | None:
    """Store and log one alert for ``resource`` (at most one per resource)."""
    if resource.alerted_at is not None:
        return None
    alert = ResourceAlert.objects.create(
        tenant_id=resource.tenant_id, resource=resource, reason=reason, raised_at=now, ownership=_ownership(resource)
    )
    RunResource.objects.filter(pk=resource.pk).update(alerted_at=now)
    resource.alerted_at = now
    log.warning(
        "resource cleanup alert (%s): %s %s of run %s in tenant %s, worker %s, %d attempt(s), first failure %s: %s",
        reason,
        resource.kind,
        resource.provider,
        resource.run_id,
        alert.ownership["tenant"],
        alert.ownership["worker"],
        resource.attempts,
        alert.ownership["first_failed_at"],
        resource.last_error,
    )
    return alert


# What the drivers answered, by resource id: (ref, driver name, its answer).
type _Answers = dict[str, tuple[ResourceRef, str, Closing]]


def _settle(claim: _Claim, answers: list[tuple[ResourceRef, str, Closing]], result: ResourceReapResult) -> None:
    """Record the drivers' answers for the rows still under ``claim``, under their runs'
    locks: CLOSED / ALREADY_GONE -> RELEASED, FAILED -> CLEANUP_FAILED (with its backoff, and
    an alert past ``RESOURCE_ALERT_AFTER_FAILURES``), in one transaction."""
    by_id = {ref.resource_id: (ref, driver, closing) for ref, driver, closing in answers}
    with transaction.atomic():
        now = timezone.now()
        run_ids = {claim.run_of[resource_id] for resource_id in by_id}
        runs = {run.pk: run for run in runs_locked_for_sweep(run_ids=run_ids, skip_locked=False)}  # in id order
        # Only the rows still under the claim (a stale claim may have been taken over), as
        # plain values: a failure, rare, reads its row whole for its alert.
        mine = list(
            claim.rows()
            .select_for_update(of=("self",))
            .order_by("pk")
            .values_list("pk", "run_id", "kind", "attempts", "alerted_at")
        )
        batch = ChainBatch(now)
        released, cleared, failed_ids = _record_released(mine, by_id, runs, batch)
        failed = _record_failures(failed_ids, by_id, runs, batch, result)
        if released:  # what is left under the claim, locked above, once the failures left it
            moved = claim.rows().update(
                state=ResourceState.RELEASED,
                released_at=now,
                released_by=SYSTEM_RESOURCE_REAPER,
                claimed_by="",
                claim_expires_at=None,
            )
            if moved != len(released):
                raise AssertionError("a claimed resource changed under its lock")
        if cleared:  # only a resource that raised an alert has one to clear
            ResourceAlert.objects.filter(resource_id__in=cleared, cleared_at__isnull=True).update(cleared_at=now)
        batch.commit()
    result.released += len(released)
    result.failed += failed


def _record_released(
    mine: list[tuple[uuid.UUID, uuid.UUID, str, int, datetime | None]],
    by_id: _Answers,
    runs: dict[uuid.UUID, Run],
    batch: ChainBatch,
) -> tuple[list[uuid.UUID], list[uuid.UUID], list[uuid.UUID]]:
    """One RESOURCE_RELEASED event for each row the driver closed (or found gone). Returns
    the ids released, those of them whose alert is to clear, and the ids that failed."""
    released, cleared, failed_ids = [], [], []
    entries: list[tuple[Run, dict[str, Any]]] = []
    for pk, run_id, kind, attempts, alerted_at in mine:
        _, driver, closing = by_id[str(pk)]
        if closing.result in (Closed.CLOSED, Closed.ALREADY_GONE):
            released.append(pk)
            if alerted_at is not None:
                cleared.append(pk)
            entries.append(
                (
                    runs[run_id],
                    {
                        "resource_id": pk,
                        "kind": kind,
                        "driver": driver,
                        "result": closing.result.value,
                        "attempts": attempts,
                    },
                )
            )
        else:
            failed_ids.append(pk)
    batch.append_many(entries, "RESOURCE_RELEASED", actor=SYSTEM_RESOURCE_REAPER)
    return released, cleared, failed_ids


def _record_failures(
    failed_ids: list[uuid.UUID],
    by_id: _Answers,
    runs: dict[uuid.UUID, Run],
    batch: ChainBatch,
    result: ResourceReapResult,
) -> int:
    """CLEANUP_FAILED, with the next attempt after a backoff, and one RESOURCE_CLEANUP_FAILED
    event each, for the rows whose driver failed; an alert for those that failed often
    enough. Returns how many failed."""
    if not failed_ids:
        return 0
    now = batch.now
    failed = list(
        RunResource.objects.select_related("tenant", "instance__worker").filter(pk__in=failed_ids).order_by("pk")
    )
    for resource in failed:
        _, driver, closing = by_id[str(resource.pk)]
        resource.state = ResourceState.CLEANUP_FAILED
        resource.last_error = failure_text(closing.detail)
        resource.first_failed_at = resource.first_failed_at or now
        resource.next_attempt_at = now + timedelta(seconds=backoff_s(resource.attempts))
        resource.claimed_by, resource.claim_expires_at = "", None
        batch.append(
            runs[resource.run_id],
            "RESOURCE_CLEANUP_FAILED",
            actor=SYSTEM_RESOURCE_REAPER,
            fields={
                "resource_id": resource.pk,
                "driver": driver,
                "attempt": resource.attempts,
                "failure": resource.last_error,
                "next_attempt_at": resource.next_attempt_at,
            },
        )
    if failed:
        RunResource.objects.bulk_update(
            failed, ["state", "last_error", "first_failed_at", "next_attempt_at", "claimed_by", "claim_expires_at"]
        )
        for resource in failed:
            if resource.attempts >= _option("RESOURCE_ALERT_AFTER_FAILURES") and alert_raise(resource, "failures", now):
                result.alerts += 1
    return len(failed)


def _alert_past_deadline(result: ResourceReapResult) -> None:
    """Open resources still not RELEASED a grace period after their deadline: one alert each."""
    now = timezone.now()
    late = (
        RunResource.objects.exclude(state=ResourceState.RELEASED)
        .filter(alerted_at__isnull=True, expires_at__lte=now - timedelta(seconds=_option("RESOURCE_DEADLINE_GRACE_S")))
        .select_related("tenant", "instance__worker")
    )
    for resource in late[:1000]:
        with transaction.atomic():
            if alert_raise(resource, "deadline", now):
                result.alerts += 1


# --- 5. instances ---------------------------------------------------------------------


def instances_settle(*, batch_size: int, result: ResourceReapResult) -> None:
    """EXPIRED -> REAPING (INSTANCE_REAPING); REAPING -> RELEASED (INSTANCE_RELEASED) once
    none of the instance's resources is open. One walk along the ``grant_reaping`` index in
    (state_changed_at, id) order, so an instance still holding open resources is read once
    per pass, not once per batch; runs are claimed with SKIP LOCKED.

    An EXPIRED instance with nothing open goes through REAPING to RELEASED in one
    conditional UPDATE (it never rests in REAPING). When it held resources (all released
    since), both transitions are recorded, the second with its cleanup verified; when it
    never held one, cleanup had nothing to verify, and one INSTANCE_RELEASED event names
    both states (``from`` EXPIRED, ``cleanup`` "nothing held"). Every UPDATE is
    conditional on the state read and answers which rows it moved, and only those get
    their events: an instance another reaper moved between the read and the lock is left
    alone."""
    after: tuple[datetime | None, int] | None = None
    while True:
        with transaction.atomic():
            now = timezone.now()
            rows = _instances_due(after, batch_size)
            if not rows:
                return
            after = (rows[-1][4], rows[-1][0])
            released = _instances_advance(rows, now)
        result.instances_released += released
        if len(rows) < batch_size:
            return


# An instance as the walk reads it: (id, run id, state, fencing_token, state_changed_at).
type _Instance = tuple[int, uuid.UUID, str, int, datetime | None]


def _instances_due(after: tuple[datetime | None, int] | None, batch_size: int) -> list[_Instance]:
    """The next ``batch_size`` EXPIRED or REAPING instances along the walk, past ``after``
    (the (state_changed_at, id) of the last one read)."""
    walk = LeaseGrant.objects.filter(state__in=[InstanceState.EXPIRED, InstanceState.REAPING])
    if after is not None:  # past the last one read
        walk = past(walk, "state_changed_at", *after)
    # The batch's last moment first, read in the index's own order (a scan that stops
    # after batch_size entries): the batch below then sorts only the rows up to it,
    # whatever the planner believes of the index (right after a lease sweep its
    # statistics still count no EXPIRED instance, and a plain ORDER BY ... LIMIT
    # sorted every one of them, batch after batch).
    last = walk.order_by("state_changed_at").values_list("state_changed_at", flat=True)
    bound = list(last[batch_size - 1 : batch_size])
    candidates = walk.filter(state_changed_at__lte=bound[0]) if bound else walk
    return list(
        candidates.order_by("state_changed_at", "pk").values_list(
            "pk", "run_id", "state", "fencing_token", "state_changed_at"
        )[:batch_size]
    )


def _instances_advance(rows: list[_Instance], now: datetime) -> int:
    """Move the instances of ``rows`` whose runs this pass can lock (SKIP LOCKED) and
    commit their INSTANCE_REAPING and INSTANCE_RELEASED events. Returns how many became
    RELEASED."""
    held = _resources_held(rows)  # instance id -> whether one of its resources is open
    movable = [r for r in rows if r[2] == InstanceState.EXPIRED or not held.get(r[0], False)]
    runs = {run.pk: run for run in runs_locked_for_sweep(run_ids={r[1] for r in movable})}
    mine = [r for r in movable if r[1] in runs]  # the others' runs are being written to: the next pass
    # Each UPDATE only for the rows read in its source state (one found in another
    # state was moved by another reaper meanwhile: the next pass reads it again).
    free = [r for r in mine if not held.get(r[0], False)]
    expired = [r[0] for r in free if r[2] == InstanceState.EXPIRED]
    through = _grants_move(expired, InstanceState.EXPIRED, InstanceState.RELEASED, now)  # via REAPING
    cleaned = [r[0] for r in free if r[2] == InstanceState.REAPING]
    released = _grants_move(cleaned, InstanceState.REAPING, InstanceState.RELEASED, now)
    reaping = _grants_move(
        [r[0] for r in mine if held.get(r[0], False)], InstanceState.EXPIRED, InstanceState.REAPING, now
    )
    bare = {pk for pk in through if pk not in held}  # held nothing: nothing to verify
    batch = ChainBatch(now)
    batch.append_many(
        [
            (runs[run_id], {"fencing_token": fencing_token})
            for pk, run_id, _, fencing_token, _ in mine
            if (pk in through and pk not in bare) or pk in reaping
        ],
        "INSTANCE_REAPING",
        actor=SYSTEM_RESOURCE_REAPER,
    )
    batch.append_many(
        [
            (runs[run_id], _released_fields(fencing_token, bare=pk in bare))
            for pk, run_id, _, fencing_token, _ in mine
            if pk in through or pk in released
        ],
        "INSTANCE_RELEASED",
        actor=SYSTEM_RESOURCE_REAPER,
    )
    batch.commit()
    return len(through) + len(released)


def _resources_held(rows: list[_Instance]) -> dict[int, bool]:
    """For each instance of ``rows`` that ever held a resource: whether one is still open
    (not RELEASED). An instance absent held none."""
    held: dict[int, bool] = {}
    states = RunResource.objects.filter(instance_id__in=[r[0] for r in rows]).values_list("instance_id", "state")
    for instance_id, state in states.distinct():
        held[instance_id] = held.get(instance_id, False) or state != ResourceState.RELEASED
    return held


def _released_fields(fencing_token: int, *, bare: bool) -> dict[str, object]:
    """INSTANCE_RELEASED's fields: cleanup verified, or (``bare``: an EXPIRED instance that
    never held a resource, moved in one step) both states named and nothing to verify."""
    if bare:
        return {
            "fencing_token": fencing_token,
            "from": InstanceState.EXPIRED.value,
            "to": InstanceState.RELEASED.value,
            "cleanup": "nothing held",
        }
    return {"fencing_token": fencing_token, "cleanup": "verified"}


def _grants_move(ids: list[int], source: InstanceState, target: InstanceState, now: datetime) -> set[int]:
    """Instances ``ids`` still in ``source`` to ``target``, their runs locked by the
    caller, in one conditional UPDATE: the ids it moved."""
    if not ids:
        return set()
    return sql_lifespan.grants_move(ids, source=source.value, target=target.value, now=now)


# --- the pass -------------------------------------------------------------------------


def resources_reap(
    *, batch_size: int | None = None, progress: Callable[[ResourceReapResult], None] | None = None
) -> ResourceReapResult:
    """One pass of the resource reaper (see the module text). Safe to run twice at once."""
    started = time.monotonic()
    batch_size = batch_size or _option("RESOURCE_REAPER_BATCH_SIZE")
    result = ResourceReapResult()

    def close_and_settle(claim: _Claim) -> None:
        _settle(claim, _close_all(claim.refs), result)
        result.batches += 1
        if progress is not None:
            progress(result)

    for claim in _overdue_claims(batch_size, result):
        close_and_settle(claim)
    while True:
        claim = _claim(batch_size)
        if not claim.refs:
            break
        close_and_settle(claim)
        if len(claim.refs) < batch_size:
            break
    _alert_past_deadline(result)
    # Instances are the lease reaper's to follow up: its batch size (500), not the resources'
    # (a batch of 200 spent a fifth more per instance on its fixed costs).
    instances_settle(batch_size=_option("REAPER_BATCH_SIZE"), result=result)
    result.seconds = time.monotonic() - started
    if progress is not None:
        progress(result)
    return result
