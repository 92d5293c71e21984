"""Celery tasks: thin wrappers around one service each, safe to run twice at once.

Every periodic job is also a management command; its batch size and interval are settings
(``FENCELINE`` in ``console/settings.py``), and its beat entry expires after one interval,
so a backlog of missed runs is never replayed at once.
"""

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, cast

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnavailable

from ledger.services.authority.flow import flow_keys_prune
from ledger.services.authority.reservations import reservations_expire
from ledger.services.evidence.retention import retention_apply
from ledger.services.evidence.verification import ledger_verify
from ledger.services.fence.ending import runs_enforce_limits
from ledger.services.fence.leases import leases_reap
from ledger.services.fleet.lifecycle import workers_drain_enforce, workers_stop_lapsed
from ledger.services.lifespan.reaper import resources_reap
from ledger.services.notifications.delivery import deliveries_send
from ledger.services.operating.jobs import job_failed, job_finished, job_started
from ledger.services.operating.totals import run_totals_store

# The one retry policy of every job: what a passing outage raises — the database going
# away or refusing connections (Django's OperationalError / InterfaceError), the broker,
# or the network — is retried with backoff and jitter; anything else is a bug and fails.
RETRYABLE: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    BrokerUnavailable,
    ConnectionError,
    TimeoutError,
)


job_log = logging.getLogger("fenceline.job")


class TaskResult[R](Protocol):
    """What Celery answers when a task is applied or queued (the part Fenceline reads)."""

    def get(self, timeout: float | None = None) -> R: ...


class Task[**P, R](Protocol):
    """A task as :func:`job` declares it (Celery ships no types): called, it runs here and
    now; ``apply`` runs it here through Celery (retries, signals); ``delay`` queues it."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    def apply(
        self, args: Sequence[object] | None = None, kwargs: Mapping[str, object] | None = None
    ) -> TaskResult[R]: ...

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> TaskResult[R]: ...


def _took(clock: float) -> dict[str, float]:
    return {"duration_ms": round((time.perf_counter() - clock) * 1000, 2)}


def beat_name(task_name: str) -> str | None:
    """The beat entry that runs ``task_name`` (``settings.CELERY_BEAT_SCHEDULE``), if any."""
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        if entry["task"] == task_name:
            return name
    return None


def job[**P, R](*, name: str | None = None, **options: object) -> Callable[[Callable[P, R]], Task[P, R]]:
    """``shared_task`` with the one retry policy and late acknowledgement (``name=``: the
    task's name, when it is not its module's and function's). A task that beat
    runs also writes its job heartbeat (ledger/services/operating/jobs.py): started, then
    finished with its counts, or failed with the exception's type."""

    def decorate(fn: Callable[P, R]) -> Task[P, R]:
        beat = beat_name(name or f"{fn.__module__}.{fn.__name__}")

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            if beat is None:
                return fn(*args, **kwargs)
            started_at = job_started(beat)
            clock = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                with contextlib.suppress(*RETRYABLE):  # the database may be what failed
                    job_failed(beat, started_at=started_at, error=exc)
                job_log.warning(
                    "job %s failed",
                    beat,
                    extra={"job": beat, "outcome": "failed", "error": type(exc).__name__, **_took(clock)},
                )
                raise
            counts = result if isinstance(result, dict) else {}
            job_finished(beat, started_at=started_at, result=counts)
            job_log.info(
                "job %s finished", beat, extra={"job": beat, "outcome": "ok", "counts": counts, **_took(clock)}
            )
            return result

        # Celery's task object, typed by what Fenceline calls on it (``Task``).
        return cast(
            Task[P, R],
            shared_task(
                acks_late=True,
                autoretry_for=RETRYABLE,
                retry_backoff=True,
                retry_backoff_max=60,
                retry_jitter=True,
                max_retries=5,
                name=name,
                **options,
            )(run),
        )

    return decorate


@job()
def reap_leases_task() -> dict[str, int]:
    result = leases_reap()
    return {"leases": result.leases, "operations": result.operations, "batches": result.batches}


@job()
def enforce_run_limits_task() -> dict[str, int]:
    """Runs past their maximum runtime time out; cancellations past their grace finish."""
    result = runs_enforce_limits()
    return {"timed_out": result.timed_out, "cancels_finished": result.finished}


@job()
def reap_resources_task() -> dict[str, int]:
    """Close what runs left behind through each kind's driver (ledger/services/lifespan/reaper.py)."""
    result = resources_reap()
    return {
        "requested": result.requested,
        "released": result.released,
        "failed": result.failed,
        "alerts": result.alerts,
        "instances_released": result.instances_released,
    }


@job()
def verify_ledger_task(run_id: str | None = None) -> dict[str, int]:
    """Verify runs whose chain moved (bounded batch), or one run; seals checkpoints."""
    result = ledger_verify(run_ids=[run_id] if run_id else None)
    return {"runs": result.runs, "events": result.events, "broken": result.broken}


@job()
def retention_task() -> dict[str, int]:
    """Diagnostic payloads past their tenant's retention lose their bytes; the flow-control rows
    of idle intent-named keys go (bounded batches, SKIP LOCKED)."""
    pruned = flow_keys_prune(now=timezone.now())
    return {"removed": retention_apply().removed, "flow_places": pruned.places, "flow_shards": pruned.shards}


@job()
def count_run_totals_task() -> dict[str, int]:
    """What each tenant's runs add up to, kept for /metrics (ledger/services/operating/totals.py)."""
    return {"tenants": run_totals_store()}


@job()
def expire_reservations_task() -> dict[str, int]:
    """Cost reservations past their TTL become UNKNOWN (bounded batches, SKIP LOCKED)."""
    return {"reservations": reservations_expire()}


@job()
def enforce_drains_task() -> dict[str, int]:
    """DRAINING workers with no lease left, or past their deadline, become QUIESCED; QUIESCED
    ones whose process heartbeat lapsed are STOPPED."""
    moved = workers_drain_enforce()
    stopped = workers_stop_lapsed(lapse_s=settings.FENCELINE["WORKER_HEARTBEAT_LAPSE_S"])
    return {"workers": moved, "stopped": stopped}


@job()
def deliver_webhooks_task() -> dict[str, int]:
    """Due webhook deliveries are sent (outside any transaction), with retries and backoff."""
    result = deliveries_send()
    return {
        "claimed": result.claimed,
        "delivered": result.delivered,
        "retrying": result.retrying,
        "gave_up": result.gave_up,
    }
