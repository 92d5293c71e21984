"""The workers pages: status, leases held, restart episodes; drain / quarantine / resume
from the console; the three permission tests; constant queries with 10 and 200 rows."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger.models import Worker
from ledger.services.fence import leases
from tests.factories import READY, booted, dispatched_operation, expire, leased_run, user_with, worker_in
from tests.helpers import Browser

URL = reverse("workers")


def queries_for(browser, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert browser.get(url).status_code == 200
    return len(captured)


def test_without_a_role_no_worker_is_listed_and_its_page_is_404(acme):
    browser = Browser(user_with(None, acme.tenant))
    assert "worker-1" not in browser.get(URL).content.decode()
    assert browser.get(reverse("worker_detail", args=[acme.worker.pk])).status_code == 404


def test_a_viewer_sees_workers_and_their_history_but_no_action(acme, viewer):
    worker_in(acme.tenant, "QUARANTINED", "bad-apple")
    browser = Browser(viewer)
    body = browser.get(URL).content.decode()
    assert "bad-apple" in body and "QUARANTINED" in body and "suspicious" in body
    assert "Drain…" not in body and "Quarantine…" not in body and "Resume…" not in body
    assert browser.get(reverse("worker_detail", args=[acme.worker.pk])).status_code == 200


def test_another_tenants_worker_is_not_listed_its_page_is_404_and_its_action_404(acme, outsider, admin):
    browser = Browser(admin)
    assert "intruder" not in browser.get(URL).content.decode()
    assert browser.get(reverse("worker_detail", args=[outsider.worker.pk])).status_code == 404
    act = browser.post(reverse("worker-act", args=[outsider.worker.pk]), {"action": "quarantine", "reason": "x"})
    assert act.status_code == 404
    assert Worker.objects.get(pk=outsider.worker.pk).status == "ACCEPTING"


def test_a_lost_lease_is_listed_with_its_takeover_and_is_not_a_restart_episode(acme, viewer):
    run, token = leased_run(acme.worker, owner="sleepy")
    expire(run)
    leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="rescuer", ttl_s=30)
    browser = Browser(viewer)
    (row,) = browser.get(URL).context["rows"]
    assert (row.held, row.lost, row.episodes) == (1, 1, 0)
    detail = browser.get(reverse("worker_detail", args=[acme.worker.pk]))
    lost = next(g for g in detail.context["grants"] if g.fencing_token == token)
    assert (lost.end_reason, lost.next_owner, lost.next_token) == ("EXPIRED", "rescuer", token + 1)


def test_draining_from_the_console_sets_the_deadline_and_refuses_new_leases(acme, admin):
    browser = Browser(admin)
    response = browser.post(
        reverse("worker-act", args=[acme.worker.pk]),
        {"action": "drain", "reason": "host patching", "deadline_min": "5"},
    )
    assert response.status_code == 302
    worker = Worker.objects.get(pk=acme.worker.pk)
    assert worker.status == "DRAINING" and worker.status_reason == "host patching"
    assert 290 <= (worker.drain_deadline - worker.status_changed_at).total_seconds() <= 300
    twice = browser.post(reverse("worker-act", args=[acme.worker.pk]), {"action": "drain", "reason": "again"})
    assert twice.status_code == 409 and "DRAINING" in twice.content.decode()


def test_an_action_without_a_reason_is_refused(acme, admin):
    browser = Browser(admin)
    assert (
        browser.post(reverse("worker-act", args=[acme.worker.pk]), {"action": "quarantine", "reason": ""}).status_code
        == 422
    )
    assert Worker.objects.get(pk=acme.worker.pk).status == "ACCEPTING"


def test_the_list_and_the_detail_cost_the_same_queries_with_10_and_200_rows(acme, admin):
    from ledger.services.fleet.workers import worker_create

    browser = Browser(admin)
    detail = reverse("worker_detail", args=[acme.worker.pk])

    def grants(n):
        for _ in range(n):
            run, token = leased_run(acme.worker)
            leases.lease_release(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token)

    for i in range(10):
        worker_create(tenant=acme.tenant, name=f"w-a{i}")
    grants(10)
    queries_for(browser, URL)  # warm the per-process caches (content types), as in a long-running server
    with_10 = (queries_for(browser, URL), queries_for(browser, detail))
    for i in range(190):
        worker_create(tenant=acme.tenant, name=f"w-b{i}")
    grants(190)
    with_200 = (queries_for(browser, URL), queries_for(browser, detail))
    assert with_10 == with_200


def boot(worker, n: int, **changes):
    """The worker's n-th boot report (config cfg-n)."""
    return booted(worker, boot_id=f"b-{n}", config_hash=f"cfg-{n}", code_version="v1", pid=100 + n, **changes)


def test_the_page_shows_paused_admission_the_boot_error_and_the_quarantine_bundle(acme, viewer, operator):
    browser = Browser(viewer)
    page = reverse("worker_detail", args=[acme.worker.pk])
    boot(acme.worker, 1)
    run, token = leased_run(acme.worker)
    dispatched_operation(acme.worker, run, token, "charge:1")  # then the process died
    assert boot(acme.worker, 2).boot.unknown_left == 1
    body = browser.get(page).content.decode()
    assert "paused: RECONCILE_FIRST" in body and "1 effect it dispatched in doubt" in body

    failed = {**READY, "state": {"ok": False, "evidence": {"schema": "7 of 8"}}}
    error = {"kind": "migration", "message": "column runs.x is missing", "at": "2026-12-04T05:00:00+00:00"}
    assert boot(acme.worker, 3, readiness=failed, error=error).quarantined
    body = browser.get(page).content.decode()
    # The bundle is the diagnostic plane: an operator's, not a viewer's.
    assert "system:state-migration" in body and "column runs.x is missing" in body  # the decision's reason
    assert "Diagnostic bundle" not in body
    body = Browser(operator).get(page).content.decode()
    assert "system:state-migration" in body and "column runs.x is missing" in body
    assert "Diagnostic bundle: 3 boots kept" in body and "cfg-3" in body
    assert "none refused" in body and "limit 50 in 60 s" in body


def test_the_drain_toast_of_a_worker_holding_no_runs_says_so(acme, admin):
    answer = Browser(admin).post(
        reverse("worker-act", args=[acme.worker.pk]), {"action": "drain", "reason": "host patching"}, follow=True
    )
    said = answer.content.decode()
    assert "It holds no runs and takes no new ones." in said
    assert "finish its 0 runs" not in said
