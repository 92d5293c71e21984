"""Lifespan in a real browser: an operator cancels a run from its page while an effect is in
flight, and the worker learns it on its next heartbeat; an admin sees a cleanup alert with
its owner and marks the stuck resource released."""

from playwright.sync_api import expect

from ledger.models import ResourceAlert, Run, RunResource
from ledger.services.lifespan.reaper import resources_reap
from tests.browser.accounts import sign_in
from tests.factories import stuck_resource


def test_an_operator_cancels_a_run_and_its_worker_learns_it_on_the_next_heartbeat(
    live_server, page, screenshot, acme, api_for, operator
):
    worker = api_for(acme)
    run_id = worker.create_run()
    assert worker.acquire(run_id, "agent-a").status == 200
    op = worker.intend(run_id, 1, "deploy:1", effect_class="IDEMPOTENT").body["operation_id"]
    worker.authorize(op, 1)
    worker.dispatch(op, 1)

    sign_in(page, live_server, operator)
    page.goto(live_server.url + f"/runs/{run_id}/")
    page.get_by_text("Cancel this run…").click()
    page.get_by_label("Cancel reason").fill("the customer withdrew the request")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#toasts")).to_contain_text("CANCELLING")
    expect(page.locator("main")).to_contain_text("the customer withdrew the request")
    expect(page.locator("main")).to_contain_text("user:olga")
    screenshot("operator_cancelled_run")

    heartbeat = worker.post(f"/runs/{run_id}/lease/renew", {"owner_id": "agent-a", "fencing_token": 1, "ttl_s": 30})
    assert heartbeat.body["cancel"]["reason"] == "the customer withdrew the request", heartbeat
    assert worker.intend(run_id, 1, "deploy:2").body["error"] == "RUN_CANCELLED"
    assert worker.outcome(op, 1, "CONFIRMED", provider_request_id="dep-1").status == 200
    assert Run.objects.get(pk=run_id).status == "CANCELLED"


def test_an_admin_sees_a_cleanup_alert_with_its_owner_and_marks_the_resource_released(
    live_server, page, screenshot, acme, settings, admin
):
    settings.FENCELINE = {**settings.FENCELINE, "RESOURCE_ALERT_AFTER_FAILURES": 4}
    resource = stuck_resource(acme.worker)  # three failed cleanups; no driver knows "portal"
    resources_reap()  # the fourth: an alert
    assert ResourceAlert.objects.filter(resource=resource).exists()

    sign_in(page, live_server, admin)
    page.goto(live_server.url + "/resources/")
    alerts = page.locator("main table").nth(1)
    expect(alerts).to_contain_text(f"portal:{resource.handle}")
    expect(alerts).to_contain_text(acme.worker.name)
    expect(alerts).to_contain_text("no cleanup driver is configured for browser_session:portal")
    screenshot("admin_resource_alert")

    row = page.locator(f"#resource-{resource.pk}")
    row.get_by_text("Mark released…").click()
    row.get_by_label("Mark released reason").fill("closed by hand in the portal's admin page")
    row.get_by_role("button", name="Mark released").click()
    expect(page.locator("#toasts")).to_contain_text("marked RELEASED")
    screenshot("admin_resource_marked_released")
    resource.refresh_from_db()
    assert (resource.state, resource.released_by) == ("RELEASED", "user:ada")
    assert RunResource.objects.exclude(state="RELEASED").count() == 0
    assert ResourceAlert.objects.get(resource=resource).cleared_at is not None
