"""The dashboard: counts that need a person now, only from tenants where the user has a
role; polled by htmx as a partial; a constant number of queries."""

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import Run, Tenant
from ledger.services.evidence.verification import run_verify
from ledger.services.fence import outcomes, runs
from tests.factories import bulk_runs, dispatched_operation, leased_run
from tests.helpers import logged_in

URL = reverse("home")


def trouble(identity) -> None:
    """One open UNKNOWN case, one lease expiring within 60 s, one BROKEN run, an open breaker."""
    run, token = leased_run(identity.worker, ttl_s=30)
    op = dispatched_operation(identity.worker, run, token, f"{identity.tenant.slug}-k")
    outcomes.operation_report_outcome(
        worker=identity.worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN"
    )
    broken, _ = leased_run(identity.worker, ttl_s=3600)
    Run.objects.filter(pk=broken.pk).update(broken_reason="mutated", stale_rejections=2)
    Tenant.objects.filter(pk=identity.tenant.pk).update(breaker_state="OPEN")


def test_without_a_role_the_dashboard_shows_nothing_of_the_tenant(roleless_client, acme):
    trouble(acme)
    page = roleless_client.get(URL)
    counts = page.context["counts"]
    assert page.status_code == 200
    assert counts["tenants"] == [] and counts["open_unknown"] == 0 and counts["broken_runs"] == 0
    assert "acme" not in page.content.decode()


def test_a_viewer_sees_their_tenants_counts(viewer_client, acme):
    trouble(acme)
    page = viewer_client.get(URL)
    counts = page.context["counts"]
    assert page.status_code == 200
    assert counts["open_unknown"] == 1
    assert counts["expiring_leases"] == 1
    assert counts["broken_runs"] == 1
    assert counts["stale_rejections"] == 2
    assert [t.slug for t in counts["breakers_not_normal"]] == ["acme"]
    body = page.content.decode()
    assert "acme: OPEN" in body and "runs with integrity BROKEN" in body


def test_another_tenants_counts_are_not_included(outsider_viewer_client, acme, outsider):
    trouble(acme)
    counts = outsider_viewer_client.get(URL).context["counts"]
    assert [row["tenant"].slug for row in counts["tenants"]] == ["globex"]
    assert counts["open_unknown"] == counts["broken_runs"] == counts["expiring_leases"] == 0
    assert counts["breakers_not_normal"] == []


def test_time_since_the_last_verified_checkpoint(viewer_client, acme):
    assert viewer_client.get(URL).context["counts"]["last_verified_at"] is None
    run, token = leased_run(acme.worker)
    runs.run_complete(worker=acme.worker, run_id=run.pk, fencing_token=token)
    run_verify(run_id=run.pk)  # a completed run is sealed with a checkpoint
    verified = viewer_client.get(URL).context["counts"]["last_verified_at"]
    assert verified is not None and timezone.now() - verified < timedelta(minutes=1)


def test_htmx_polls_the_counts_partial_every_10_seconds(viewer_client, acme):
    full = viewer_client.get(URL).content.decode()
    assert 'hx-trigger="every 10s"' in full and f'hx-get="{URL}"' in full
    partial = viewer_client.get(URL, headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<div id="counts"') and "<html" not in partial


def count_queries(client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(URL).status_code == 200
    return len(ctx.captured_queries)


def test_the_number_of_queries_does_not_grow_with_the_rows(viewer, acme):
    client = logged_in(viewer)
    trouble(acme)
    bulk_runs(acme.tenant, 10, broken_reason="gap")
    few = count_queries(client)
    bulk_runs(acme.tenant, 200, broken_reason="gap")
    assert count_queries(client) == few
    assert client.get(URL).context["counts"]["broken_runs"] == 211


def test_the_background_jobs_table_shows_which_job_is_not_fresh_and_why(roleless_client):
    from django.conf import settings

    from ledger.models import JobHeartbeat

    now = timezone.now()
    for name in settings.CELERY_BEAT_SCHEDULE:
        JobHeartbeat.objects.create(name=name, last_finished_at=now, runs=4, last_duration_ms=12)
    JobHeartbeat.objects.filter(name="verify-ledger").update(
        last_finished_at=now - timedelta(hours=1), last_failed_at=now, last_error="OperationalError", failures=3
    )
    page = roleless_client.get(URL)
    html = page.content.decode()
    jobs = {job.name: job for job in page.context["jobs"]}
    assert set(jobs) == set(settings.CELERY_BEAT_SCHEDULE)
    assert not jobs["verify-ledger"].fresh and jobs["reap-leases"].fresh
    assert "failing with OperationalError" in jobs["verify-ledger"].reason
    assert html.count(">not fresh<") == 1 and html.count(">fresh<") == len(jobs) - 1
    partial = roleless_client.get(URL, headers={"HX-Request": "true"}).content.decode()
    assert "failing with OperationalError" in partial


def test_counts_past_the_cap_say_at_least(viewer_client, acme, monkeypatch):
    """Open cases and expiring leases are counted up to DASHBOARD_COUNT_CAP per tenant (at
    100,000 open cases an exact count read every one): a count at the cap is exact, one past
    it shows as "cap+"."""
    from ledger import selectors

    monkeypatch.setattr(selectors, "DASHBOARD_COUNT_CAP", 2)
    for n in range(3):  # three UNKNOWN cases, each on a run whose lease expires within 60 s
        run, token = leased_run(acme.worker, owner=f"o-{n}", ttl_s=30)
        op = dispatched_operation(acme.worker, run, token, f"capped-{n}")
        outcomes.operation_report_outcome(
            worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN"
        )
    page = viewer_client.get(URL)
    counts = page.context["counts"]
    assert (counts["open_unknown"], counts["expiring_leases"]) == (2, 2)
    assert counts["capped"] == {"open_unknown", "expiring_leases"} == counts["tenants"][0]["capped"]
    assert page.content.decode().count('<div class="value">2+</div>') == 2

    monkeypatch.setattr(selectors, "DASHBOARD_COUNT_CAP", 3)
    counts = viewer_client.get(URL).context["counts"]
    assert (counts["open_unknown"], counts["expiring_leases"], counts["capped"]) == (3, 3, set())
