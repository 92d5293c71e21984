"""The credential-lease pages: the list and its filters, the revocation preview (leases,
runs, operations in flight; nothing changes), revoke one / by principal / by prefix,
rotate; the three permission tests; constant queries with 10 and 200 leases."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger.errors import Denied
from ledger.models import CredentialLease, Event
from ledger.services.authority import credential_leases
from ledger.services.core.intent import Intent
from ledger.services.fence import operations
from tests.factories import active_leases, user_with
from tests.helpers import Browser

URL = reverse("credentials")
PREVIEW = reverse("credential-revoke-preview")
REVOKE = reverse("credential-revoke")


def queries_for(browser, url, data=None) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = browser.get(url, data)
        assert response.status_code == 200, response.content[:500]
    return len(captured)


# --- the three permission tests ------------------------------------------------------------


def test_without_a_role_no_lease_is_listed_and_the_preview_is_404(acme):
    (lease,) = active_leases(acme, 1)
    browser = Browser(user_with(None, acme.tenant))
    page = browser.get(URL)
    assert page.status_code == 200 and str(lease.pk)[:8] not in page.content.decode()
    assert browser.get(PREVIEW, {"tenant": "acme", "lease": str(lease.pk)}).status_code == 404


def test_a_viewer_sees_leases_but_no_revoke_or_rotate_and_the_preview_is_403(acme, viewer):
    (lease,) = active_leases(acme, 1)
    browser = Browser(viewer)
    body = browser.get(URL).content.decode()
    assert str(lease.pk)[:8] in body and "github-bot" in body and "vault:kv/github-bot" in body
    assert "Revoke…" not in body and "Rotate…" not in body and "Revoke in bulk" not in body
    assert browser.get(PREVIEW, {"tenant": "acme", "lease": str(lease.pk)}).status_code == 403


def test_another_tenants_leases_are_not_listed_and_its_preview_is_404(acme, outsider, admin):
    (theirs,) = active_leases(outsider, 1)
    browser = Browser(admin)
    assert str(theirs.pk)[:8] not in browser.get(URL).content.decode()
    assert browser.get(URL, {"tenant": "globex"}).context["rows"] == []
    assert browser.get(PREVIEW, {"tenant": "globex", "lease": str(theirs.pk)}).status_code == 404


# --- filters --------------------------------------------------------------------------------


def test_filters_by_principal_state_and_prefix(acme, viewer):
    mine = active_leases(acme, 2, principal="github-bot")
    other = active_leases(acme, 1, principal="deploy-bot")
    credential_leases.credential_lease_revoke(tenant=acme.tenant, lease_id=mine[0].pk, revoked_by="ann", reason="done")
    browser = Browser(viewer)

    def ids(**params):
        return {row.pk for row in browser.get(URL, params).context["rows"]}

    assert ids(principal="github-bot") == {mine[1].pk}
    assert ids(principal="github-bot", state="revoked") == {mine[0].pk}
    assert ids(state="all") == {mine[0].pk, mine[1].pk, other[0].pk}
    assert ids(prefix=str(other[0].pk)[:8], state="all") == {other[0].pk}
    refused = browser.get(URL, {"prefix": "zz"})
    assert refused.context["rows"] == [] and "hex digits" in refused.content.decode()


def test_keyset_pages_cover_every_lease_once_newest_first(acme, viewer):
    leases = active_leases(acme, 60)
    browser = Browser(viewer)
    seen, params = [], {}
    while True:
        page = browser.get(URL, params)
        seen.extend(row.pk for row in page.context["rows"])
        if not page.context["next_cursor"]:
            break
        params = {"after": page.context["next_cursor"]}
    assert seen == [lease.pk for lease in sorted(leases, key=lambda x: (x.issued_at, x.pk), reverse=True)]


# --- preview and revoke ---------------------------------------------------------------------


def authorized_under(identity, lease, key="push-1"):
    op, _ = operations.operation_intend(
        worker=identity.worker,
        run_id=lease.run_id,
        fencing_token=lease.run.lease.fencing_token,
        intent=Intent(
            tool="git", action="read", resource="repo:acme/widgets", effect_class="IDEMPOTENT", idempotency_key=key
        ),
    )
    operations.operation_authorize(
        worker=identity.worker,
        operation_id=op.pk,
        fencing_token=lease.run.lease.fencing_token,
        credential_lease_id=lease.pk,
    )
    return op


def test_the_preview_names_the_leases_runs_and_operations_in_flight_and_changes_nothing(acme, admin):
    leases = active_leases(acme, 3, runs=2)
    op = authorized_under(acme, leases[0])
    browser = Browser(admin)
    events = Event.objects.count()
    page = browser.get(PREVIEW, {"tenant": "acme", "principal": "github-bot"})
    body = page.content.decode()
    assert page.status_code == 200
    assert {lease.pk for lease in page.context["preview"]["leases"]} == {lease.pk for lease in leases}
    assert page.context["preview"]["run_count"] == 2
    assert [o.pk for o in page.context["preview"]["operations"]] == [op.pk]
    assert "push-1" in body and "its dispatch will be refused (DENY_REVOKED)" in body
    assert Event.objects.count() == events
    assert not CredentialLease.objects.filter(revoked_at__isnull=False).exists()


def test_revoking_by_principal_revokes_exactly_the_previewed_leases_and_dispatch_is_refused(acme, admin):
    leases = active_leases(acme, 2)
    untouched = active_leases(acme, 1, principal="deploy-bot")
    op = authorized_under(acme, leases[0])
    browser = Browser(admin)
    response = browser.post(REVOKE, {"tenant": "acme", "principal": "github-bot", "reason": "leaked in a log"})
    assert response.status_code == 302
    revoked = CredentialLease.objects.filter(revoked_at__isnull=False)
    assert {lease.pk for lease in revoked} == {lease.pk for lease in leases}
    assert {(lease.revoked_by, lease.revoke_reason) for lease in revoked} == {("ada", "leaked in a log")}
    assert CredentialLease.objects.get(pk=untouched[0].pk).revoked_at is None
    try:
        operations.operation_dispatch(
            worker=acme.worker, operation_id=op.pk, fencing_token=leases[0].run.lease.fencing_token
        )
    except Denied as refused:
        assert refused.code == "DENY_REVOKED"
    else:
        raise AssertionError("a dispatch under a revoked lease went through")


def test_a_revocation_without_a_reason_or_selection_is_refused_and_changes_nothing(acme, admin):
    (lease,) = active_leases(acme, 1)
    browser = Browser(admin)
    assert browser.post(REVOKE, {"tenant": "acme", "lease": str(lease.pk), "reason": " "}).status_code == 422
    assert browser.post(REVOKE, {"tenant": "acme", "reason": "why"}).status_code == 422
    assert browser.post(REVOKE, {"tenant": "acme", "prefix": "ab", "reason": "why"}).status_code == 422
    assert CredentialLease.objects.get(pk=lease.pk).revoked_at is None


def test_rotation_from_the_console_makes_older_leases_stale(acme, admin):
    (lease,) = active_leases(acme, 1)
    browser = Browser(admin)
    assert (
        browser.post(
            reverse("credential-rotate"), {"tenant": "acme", "principal": "github-bot", "reason": "yearly"}
        ).status_code
        == 302
    )
    lease.refresh_from_db()
    assert lease.credential.version == 2 and lease.version == 1
    assert Event.objects.filter(run_id=lease.run_id, type="CREDENTIAL_ROTATED").count() == 1
    missing = browser.post(reverse("credential-rotate"), {"tenant": "acme", "principal": "nobody-bot", "reason": "x"})
    assert missing.status_code == 404


# --- constant queries -----------------------------------------------------------------------


def test_the_list_and_the_preview_cost_the_same_queries_with_10_and_200_leases(acme, admin):
    browser = Browser(admin)
    active_leases(acme, 10, runs=5)
    browser.get(URL)  # the process's caches (content types) warm, as after any first request
    with_10 = (queries_for(browser, URL), queries_for(browser, PREVIEW, {"tenant": "acme", "principal": "github-bot"}))
    active_leases(acme, 190, runs=5)
    with_200 = (queries_for(browser, URL), queries_for(browser, PREVIEW, {"tenant": "acme", "principal": "github-bot"}))
    assert with_10 == with_200
