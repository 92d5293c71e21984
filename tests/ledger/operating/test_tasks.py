"""The jobs' one retry policy, and their schedule: a passing outage of the database (or the
broker) is retried with backoff; a bug is not; every beat entry expires after one interval
and names a task that exists; batch sizes come from settings."""

import pytest
from django.conf import settings
from django.db import OperationalError

from console.celery import app
from ledger import tasks
from ledger.services.fence.leases import ReapResult, leases_reap
from tests.factories import expire, leased_run

OUR_TASKS = sorted(name for name in app.tasks if name.startswith(("ledger.", "approvals.")))


def test_every_job_shares_the_one_retry_policy_which_includes_the_databases_errors():
    assert len(OUR_TASKS) >= 5
    for name in OUR_TASKS:
        task = app.tasks[name]
        assert OperationalError in task.autoretry_for, name
        assert tuple(task.autoretry_for) == tasks.RETRYABLE, name
        assert task.retry_backoff and task.retry_jitter and task.max_retries == 5, name
        assert task.acks_late, name


@pytest.mark.django_db
def test_a_database_outage_is_retried_and_the_job_then_finishes(monkeypatch):
    calls = []

    def flaky_reap():
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("the server closed the connection unexpectedly")
        return ReapResult(leases=3, operations=1, batches=1)

    monkeypatch.setattr(tasks, "leases_reap", flaky_reap)
    result = tasks.reap_leases_task.apply().get()
    assert result == {"leases": 3, "operations": 1, "batches": 1}
    assert len(calls) == 2


@pytest.mark.django_db
def test_a_bug_is_not_retried(monkeypatch):
    calls = []

    def broken_reap():
        calls.append(1)
        raise KeyError("a bug, not an outage")

    monkeypatch.setattr(tasks, "leases_reap", broken_reap)
    with pytest.raises(KeyError):
        tasks.reap_leases_task.apply().get()
    assert len(calls) == 1


def test_every_beat_entry_names_a_task_and_expires_after_one_interval():
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert {entry["task"] for entry in schedule.values()} <= set(app.tasks)
    for name, entry in schedule.items():
        assert entry["options"]["expires"] == entry["schedule"] > 0, name


@pytest.mark.django_db
def test_a_jobs_batch_size_comes_from_settings(acme, monkeypatch):
    for _ in range(5):
        run, _ = leased_run(acme.worker)
        expire(run)
    monkeypatch.setitem(settings.FENCELINE, "REAPER_BATCH_SIZE", 2)
    batches = []
    result = leases_reap(progress=lambda r: batches.append(r.leases))
    assert (result.leases, result.batches) == (5, 3)
    assert batches == [2, 4, 5]


@pytest.mark.django_db
def test_each_beat_job_writes_its_heartbeat_with_its_totals_and_the_type_of_a_failure(monkeypatch):
    from ledger.models import JobHeartbeat

    monkeypatch.setattr(tasks, "leases_reap", lambda: ReapResult(leases=3, operations=1, batches=1))
    tasks.reap_leases_task.apply().get()
    tasks.reap_leases_task.apply().get()
    beat = JobHeartbeat.objects.get(name="reap-leases")
    assert (beat.runs, beat.failures, beat.totals) == (2, 0, {"leases": 6, "operations": 2, "batches": 2})
    assert beat.last_finished_at is not None and beat.last_started_at <= beat.last_finished_at

    def broken_reap():
        raise KeyError("canary-job-secret-in-a-message")

    monkeypatch.setattr(tasks, "leases_reap", broken_reap)
    with pytest.raises(KeyError):
        tasks.reap_leases_task.apply().get()
    beat.refresh_from_db()
    assert (beat.runs, beat.failures, beat.last_error) == (2, 1, "KeyError")
    assert "canary" not in str(JobHeartbeat.objects.values().get(name="reap-leases"))
