"""/healthz, /readyz, /readyz/jobs and who may scrape /metrics: the readiness of each domain
fails on its own, with the domain named and nothing secret in the answer; what only delays
background work (broker, jobs) leaves /readyz at 200 "degraded" and fails /readyz/jobs;
/healthz stays up throughout."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from ledger.models import JobHeartbeat
from ledger.observability import health

pytestmark = pytest.mark.django_db

CANARY_BROKER_PASSWORD = "canary-broker-pw-7Hq2xZ9"


@pytest.fixture(autouse=True)
def _fresh_schema_check(monkeypatch):
    monkeypatch.setattr(health, "_schema_cache", health._SchemaCache())


def all_jobs_fresh(age_s: float = 1.0) -> None:
    at = timezone.now() - timedelta(seconds=age_s)
    for name in settings.CELERY_BEAT_SCHEDULE:
        JobHeartbeat.objects.update_or_create(name=name, defaults={"last_finished_at": at, "runs": 1})


def test_ready_when_every_domain_holds(client):
    all_jobs_fresh()
    answer = client.get("/readyz")
    assert answer.status_code == 200, answer.json()["checks"]["schema"]
    body = answer.json()
    assert body["status"] == "ready" and body["failing"] == [] and body["degraded"] == []
    assert set(body["checks"]) == {"database", "broker", "jobs", "evidence_keys", "schema", "fence"}
    jobs = client.get("/readyz/jobs")
    assert jobs.status_code == 200 and jobs.json()["status"] == "ready"
    assert set(jobs.json()["checks"]) == {"broker", "jobs"}


def test_a_job_that_never_finished_or_is_stale_degrades_readyz_and_fails_the_jobs_path(client):
    all_jobs_fresh()
    JobHeartbeat.objects.filter(name="verify-ledger").delete()
    answer = client.get("/readyz")
    assert answer.status_code == 200
    body = answer.json()
    assert body["status"] == "degraded" and body["failing"] == [] and body["degraded"] == ["jobs"]
    assert body["checks"]["jobs"]["verify-ledger"] == "never finished"
    jobs = client.get("/readyz/jobs")
    assert jobs.status_code == 503 and jobs.json()["failing"] == ["jobs"]

    interval = settings.CELERY_BEAT_SCHEDULE["reap-leases"]["schedule"]
    allowed = interval * settings.FENCELINE["JOB_STALE_AFTER_INTERVALS"] + settings.FENCELINE["JOB_STALE_GRACE_S"]
    all_jobs_fresh()
    JobHeartbeat.objects.filter(name="reap-leases").update(
        last_finished_at=timezone.now() - timedelta(seconds=allowed + 5),
        last_failed_at=timezone.now(),
        last_error="OperationalError",
    )
    assert client.get("/readyz").status_code == 200
    answer = client.get("/readyz/jobs")
    assert answer.status_code == 503
    reason = answer.json()["checks"]["jobs"]["reap-leases"]
    assert "failing with OperationalError" in reason
    assert client.get("/healthz").status_code == 200


def test_the_broker_down_degrades_readyz_and_fails_the_jobs_path_without_naming_its_url(client, settings):
    all_jobs_fresh()
    # Nothing listens on port 1; the URL carries a password that must not be echoed.
    settings.CELERY_BROKER_URL = f"redis://:{CANARY_BROKER_PASSWORD}@127.0.0.1:1/0"
    answer = client.get("/readyz")
    assert answer.status_code == 200
    body = answer.json()
    assert body["status"] == "degraded" and body["failing"] == [] and body["degraded"] == ["broker"]
    assert body["checks"]["broker"]["reason"].startswith("not reachable (")
    jobs = client.get("/readyz/jobs")
    assert jobs.status_code == 503 and jobs.json()["failing"] == ["broker"]
    for text in (answer.content.decode(), jobs.content.decode()):
        assert CANARY_BROKER_PASSWORD not in text
        assert "127.0.0.1:1" not in text
    assert client.get("/healthz").json() == {"status": "ok"}


def test_a_pending_migration_fails_the_database_domain(client):
    all_jobs_fresh()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = 'ledger' AND name = '0016_job_heartbeat'")
    answer = client.get("/readyz")
    assert answer.status_code == 503
    body = answer.json()
    assert "database" in body["failing"]
    assert body["checks"]["database"]["pending"] == ["ledger.0016_job_heartbeat"]
    assert client.get("/healthz").status_code == 200


def test_a_record_of_an_unknown_schema_version_fails_the_schema_domain(client, acme):
    all_jobs_fresh()
    from ledger.models import Run

    run = Run.objects.create(tenant=acme.tenant)
    Run.objects.filter(pk=run.pk).update(schema_version=99)
    body = client.get("/readyz").json()
    assert body["failing"] == ["schema"]
    assert "ledger.Run" in body["checks"]["schema"]["tables"]


def test_a_restored_image_fails_the_fence_domain_and_refuses_fenced_calls(client, acme, monkeypatch):
    """A fence row whose home is another database (what pg_restore of a dump leaves): /readyz
    names the fence, and a fenced call answers 503 RESTORE_UNCHECKED with Retry-After."""
    import weakref

    from ledger.models import FenceGeneration
    from ledger.sql import fence as sql_fence
    from tests.factories import new_run

    all_jobs_fresh()
    run = new_run(acme.worker)
    FenceGeneration.objects.filter(pk=1).update(home="7716236673950853339:16384:16390")
    monkeypatch.setattr(sql_fence, "_AT_HOME", weakref.WeakSet())  # this connection checks again
    body = client.get("/readyz").json()
    assert body["failing"] == ["fence"]
    assert "restore_check" in body["checks"]["fence"]["reason"]
    answer = client.post(
        f"/api/v1/runs/{run.pk}/lease",
        {"owner_id": "w1", "ttl_s": 30},
        content_type="application/json",
        headers={"Authorization": f"Bearer {acme.token}"},
    )
    assert answer.status_code == 503 and answer.json()["error"] == "RESTORE_UNCHECKED"
    assert int(answer.headers["Retry-After"]) >= 1


def test_missing_evidence_keys_fail_their_domain(client, settings):
    all_jobs_fresh()
    settings.FENCELINE = {**settings.FENCELINE, "EVENT_SIGNING_KEY_ID": "gone"}
    body = client.get("/readyz").json()
    assert body["failing"] == ["evidence_keys"]


def test_metrics_need_the_scrape_token_when_one_is_set(client, settings):
    settings.FENCELINE = {**settings.FENCELINE, "METRICS_TOKEN": "scrape-token-for-tests"}
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    answer = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-for-tests")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/plain; version=0.0.4")


def test_metrics_without_a_token_answer_only_the_allowed_addresses(client, settings):
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1
    refused = client.get("/metrics", REMOTE_ADDR="10.1.2.3")
    assert refused.status_code == 403 and refused.json()["error"] == "FORBIDDEN"


def test_an_ha_deployment_without_a_synchronous_standby_degrades_readyz_naming_replication(client, settings):
    """The test database streams to no standby: with FENCELINE_HA=1 the "replication" check
    fails (degraded: /readyz 200, /readyz/jobs 503); without it there is no such check. The
    passing side (a streaming synchronous standby) is tests/ha/test_failover.py's."""
    all_jobs_fresh()
    assert "replication" not in client.get("/readyz").json()["checks"]
    settings.FENCELINE = {**settings.FENCELINE, "HA": True}
    answer = client.get("/readyz")
    body = answer.json()
    assert answer.status_code == 200 and body["status"] == "degraded" and body["degraded"] == ["replication"]
    assert body["checks"]["replication"] == {
        "ok": False,
        "reason": "no synchronous standby configured (synchronous_standby_names is empty)",
    }
    jobs = client.get("/readyz/jobs")
    assert jobs.status_code == 503 and jobs.json()["failing"] == ["replication"]
