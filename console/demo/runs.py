"""Runs the fence decided: an effect confirmed and sealed, an owner fenced by a takeover, an
effect whose answer timed out, a chain an intruder extended (BROKEN), and two stuck runs (an
owner gone quiet with an effect in flight and a failed one to retry; a run nobody leases)."""

import contextlib
from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from console.demo.acting import Acting
from ledger.errors import StaleToken
from ledger.models import Event, LeaseGrant, Operation, Run, RunLease
from ledger.services.evidence.append import build_event
from ledger.services.fence import leases, notes, runs
from ledger.states import EffectClass, Outcome


def confirmed(acting: Acting) -> None:
    """Verified: an effect confirmed, the run completed and sealed."""
    run, token = acting.leased("demo-confirmed")
    acting.outcome(acting.dispatch(run, token, "demo:issue:1"), token, Outcome.CONFIRMED, provider_request_id="gh-1001")
    runs.run_complete(worker=acting.worker, run_id=run.pk, fencing_token=token)


def takeover(acting: Acting) -> None:
    """A stalled owner fenced: its in-flight effect is UNKNOWN with a case, and its late report
    is kept as unverified evidence."""
    run, token = acting.leased("demo-takeover", owner="agent-stalled", ttl_s=60)
    op = acting.dispatch(
        run,
        token,
        "demo:email:7",
        tool="email",
        action="send",
        resource="mailto:ops@example.com",
        effect=EffectClass.NON_RETRYABLE,
    )
    RunLease.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))  # the demo's clock
    leases.lease_acquire(worker=acting.worker, run_id=run.pk, owner_id="agent-rescue", ttl_s=3600)
    with contextlib.suppress(StaleToken):  # expected: that is the point of this run
        acting.outcome(op, token, Outcome.CONFIRMED, provider_request_id="msg-77")


def timed_out(acting: Acting) -> None:
    """UNKNOWN without stale evidence: the provider timed out after accepting."""
    run, token = acting.leased("demo-timeout")
    op = acting.dispatch(run, token, "demo:deploy:3", tool="deploy", action="release", resource="service:web")
    acting.outcome(op, token, Outcome.UNKNOWN, error_code="READ_TIMEOUT")


def broken(acting: Acting) -> None:
    """A run whose chain is BROKEN: an event slipped in past the recorded head, hashed and
    linked like the real thing by an intruder without the event key (so no MAC)."""
    run, token = acting.leased("demo-broken")
    notes.event_append(
        worker=acting.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"step": "checked"}
    )
    forged = build_event(
        Run.objects.get(pk=run.pk),
        type="NOTE",
        actor="worker:intruder/x",
        fields={"step": "forged"},
        occurred_at=timezone.now(),
    )
    forged.mac_key_id = forged.mac = ""
    Event.objects.bulk_create([forged])  # INSERT is what the trigger allows; the head does not move


STUCK_FOR = timedelta(minutes=40)  # past the starter policy's stuck_after_s (15 min)


def stuck(acting: Acting) -> None:
    """Two stuck runs (the runs list's "stuck" filter, the dashboard's card): an owner that
    holds its lease but has made no progress for 40 minutes, with an email in flight (what a
    force-release turns UNKNOWN) and a failed ticket (what an admin may retry); and a run
    whose owner released its lease 40 minutes ago and that nobody has taken since."""
    run, token = acting.leased("demo-stuck-quiet", owner="agent-quiet")
    failed = acting.dispatch(run, token, "demo:ticket:9", tool="tickets", action="create", resource="queue:support")
    acting.outcome(failed, token, Outcome.FAILED, error_code="HTTP_503")
    acting.dispatch(
        run,
        token,
        "demo:email:12",
        tool="email",
        action="send",
        resource="mailto:customer@example.com",
        effect=EffectClass.NON_RETRYABLE,
    )
    orphan, orphan_token = acting.leased("demo-stuck-unleased", owner="agent-gone")
    leases.lease_release(worker=acting.worker, run_id=orphan.pk, owner_id="agent-gone", fencing_token=orphan_token)
    _earlier([run, orphan], by=STUCK_FOR)


def _earlier(runs_: list[Run], *, by: timedelta) -> None:
    """The demo's clock: what these runs did happened ``by`` earlier (their chains keep the
    times they were written at)."""
    ids = [run.pk for run in runs_]
    for model, key, names in (
        (Run, "pk__in", ("created_at", "last_progress_at")),
        (RunLease, "run_id__in", ("acquired_at", "last_renewed_at")),
        (LeaseGrant, "run_id__in", ("acquired_at", "ended_at", "state_changed_at")),
        (Operation, "run_id__in", ("created_at", "updated_at", "dispatched_at")),
    ):
        for name in names:
            model.objects.filter(**{key: ids, f"{name}__isnull": False}).update(**{name: F(name) - by})
    RunLease.objects.filter(run_id__in=ids, owner_id__isnull=True).update(expires_at=F("expires_at") - by)
