"""A worker that keeps writing with dead tokens is told to stop (the run-lease article's
"Recover: stop the worker"). Each stale-token refusal (STALE_TOKEN, LEASE_LOST) of a
worker's request is counted in a window on the worker row; past the policy's
``stale_token_limit`` (50 in 60 s) the worker is QUARANTINED with its diagnostic bundle,
and from then on every API response to it carries ``Fenceline-Directive: STOP_WORKER``
(``ledger/api``), which the client raises as ``StopWorker`` at its next call."""

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from ledger.models import Worker
from ledger.services.authority.policy import policy_current
from ledger.services.fleet.boots import quarantine_with_bundle
from ledger.services.fleet.lifecycle import QUARANTINE_FROM
from ledger.states import WorkerStatus

SYSTEM_STALE_TOKENS = "system:stale-tokens"
DIRECTIVE_HEADER = "Fenceline-Directive"
STOP_WORKER = "STOP_WORKER"
DEFAULT_LIMIT = {"max_rejections": 50, "window_s": 60}


def worker_stale_rejected(*, worker: Worker, now: datetime | None = None) -> bool:
    """Count one stale-token refusal of ``worker``'s; quarantine it when the count passes
    the limit within the window. Called after the refusal's own record committed, in its
    own transaction: the worker row is locked first, then its leases (the lock order of
    every quarantine). True when this refusal quarantined the worker."""
    _, policy = policy_current(tenant=worker.tenant)
    limit = policy.get("stale_token_limit", DEFAULT_LIMIT)
    now = now or timezone.now()
    in_window = Q(stale_window_started_at__gt=now - timedelta(seconds=limit["window_s"]))
    with transaction.atomic():
        Worker.objects.filter(pk=worker.pk).update(
            stale_in_window=Case(When(in_window, then=F("stale_in_window") + 1), default=Value(1)),
            stale_window_started_at=Case(When(in_window, then=F("stale_window_started_at")), default=Value(now)),
        )
        locked = Worker.objects.select_for_update().get(pk=worker.pk)
        started = locked.stale_window_started_at
        if started is None or locked.stale_in_window <= limit["max_rejections"] or locked.status not in QUARANTINE_FROM:
            return False
        window = f"{locked.stale_in_window} stale-token rejections within {limit['window_s']} s"
        quarantine_with_bundle(
            locked,
            actor=SYSTEM_STALE_TOKENS,
            reason=f"{window}: the worker keeps writing with dead tokens; stop it",
            now=now,
            evidence={
                "stale_rejections": {
                    "count": locked.stale_in_window,
                    "window_started_at": started.isoformat(),
                    "limit": limit,
                }
            },
        )
    worker.status = WorkerStatus.QUARANTINED
    return True


def directive_for(worker: Worker | None) -> str:
    """The directive every response to this worker carries ("" for none)."""
    return STOP_WORKER if worker is not None and worker.status == WorkerStatus.QUARANTINED else ""
