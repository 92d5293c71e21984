"""An admin in a real browser: previews a credential-lease revocation (the lease, its run,
the operation authorized under it), revokes it with a reason, and the worker's next
dispatch using the lease is refused over the API; quarantines a worker from its page."""

from playwright.sync_api import expect

from ledger.models import CredentialLease, Worker
from tests.browser.accounts import sign_in
from tests.factories import active_leases


def test_an_admin_previews_and_revokes_a_lease_and_the_next_dispatch_is_refused(
    live_server, page, screenshot, acme, api_for, admin
):
    (lease,) = active_leases(acme, 1)
    token = lease.run.lease.fencing_token
    worker = api_for(acme)
    op_id = worker.intend(
        str(lease.run_id), token, "git:read:1", tool="git", action="read", resource="repo:acme/widgets"
    ).body["operation_id"]
    granted = worker.post(
        f"/operations/{op_id}/authorize", {"fencing_token": token, "credential_lease_id": str(lease.pk)}
    )
    assert granted.body["decision"] == "ALLOW", granted

    sign_in(page, live_server, admin)
    page.goto(live_server.url + "/credentials/")
    page.locator(f"#lease-{lease.pk}").get_by_role("link", name="Revoke…").click()
    expect(page.get_by_role("heading", name="Revoke: what this will touch")).to_be_visible()
    expect(page.locator("main")).to_contain_text(str(lease.pk))
    expect(page.locator("main")).to_contain_text("git:read:1")
    expect(page.locator("main")).to_contain_text("its dispatch will be refused (DENY_REVOKED)")
    screenshot("admin_revoke_preview")
    assert CredentialLease.objects.get(pk=lease.pk).revoked_at is None  # a preview changes nothing

    page.get_by_label("Revocation reason").fill("token seen in a build log")
    page.get_by_role("button", name="Revoke this lease").click()
    expect(page.locator("#toasts")).to_contain_text("revoked")
    expect(page.locator(f"#lease-{lease.pk}")).to_contain_text("REVOKED")
    expect(page.locator(f"#lease-{lease.pk}")).to_contain_text("by ada: token seen in a build log")
    screenshot("admin_revoked")

    refused = worker.dispatch(op_id, token)
    assert (refused.status, refused.body["error"]) == (403, "DENY_REVOKED"), refused


def test_an_admin_quarantines_a_worker_and_its_lease_ends(live_server, page, screenshot, acme, api_for, admin):
    worker = api_for(acme)
    run_id = worker.create_run()
    token = worker.acquire(run_id, "agent-a").body["fencing_token"]

    sign_in(page, live_server, admin)
    page.goto(live_server.url + f"/workers/{acme.worker.pk}/")
    page.get_by_text("Quarantine…").click()
    page.get_by_label("Quarantine reason").fill("host compromised")
    page.get_by_role("button", name=f"Quarantine {acme.worker.name}").click()
    expect(page.locator("#toasts")).to_contain_text("QUARANTINED")
    expect(page.locator("main")).to_contain_text("REVOKED")
    screenshot("admin_quarantined_worker")

    assert Worker.objects.get(pk=acme.worker.pk).status == "QUARANTINED"
    stale = worker.intend(run_id, token, "late-write")
    assert (stale.status, stale.body["error"]) == (409, "STALE_TOKEN")
