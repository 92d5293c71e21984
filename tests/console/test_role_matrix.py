"""The role matrix, over real HTTP with a session and a CSRF token: every role (and a user
with none) tries every decision-queue action on its own tenant and on another tenant's
object. Allowed actions change state and leave an event naming the user and the reason;
refused ones are 403 (own tenant, seen but not allowed) or 404 (not visible) and change
nothing at all."""

import pytest
from django.urls import reverse

from approvals.models import ApprovalRequest, ReconciliationCase
from ledger.models import Event
from tests.console.queues_fixtures import (
    ROLES,
    Browser,
    pending_approvals,
    snapshot,
    unknown_case,
    user_with,
)

CASE_ACTIONS = ("claim", "resolve", "escalate", "bulk_resolve")
APPROVAL_ACTIONS = ("approve", "deny")
MAY = {
    "claim": {"operator", "admin"},
    "resolve": {"operator", "admin"},
    "escalate": {"operator", "admin"},
    "bulk_resolve": {"operator", "admin"},
    "approve": {"approver", "admin"},
    "deny": {"approver", "admin"},
}
REASON = "checked with the provider console"


def perform(browser: Browser, action: str, case: ReconciliationCase, approval: ApprovalRequest):
    """The POST(s) a person makes for ``action``; returns the final response and what the
    event for it must look like."""
    if action == "claim":
        return browser.post(reverse("case-claim", args=[case.pk])), case.run_id, "CASE_CLAIMED", None
    if action == "resolve":
        data = {"resolution": "HAPPENED", "provider_request_id": "prov-991", "reason": REASON}
        return browser.post(reverse("case-resolve", args=[case.pk]), data), case.run_id, "OPERATION_RECONCILED", REASON
    if action == "escalate":
        return browser.post(reverse("case-escalate", args=[case.pk]), {"reason": REASON}), case.run_id, "CASE_ESCALATED", REASON
    if action == "bulk_resolve":
        data = {"case": [str(case.pk)], "resolution": "COMPENSATED", "reason": REASON}
        preview = browser.post(reverse("cases-bulk"), data)
        if preview.status_code != 200:
            return preview, case.run_id, "OPERATION_RECONCILED", REASON
        assert str(case.pk) in preview.content.decode()
        return browser.post(reverse("cases-bulk"), {**data, "confirm": "1"}), case.run_id, "OPERATION_RECONCILED", REASON
    decision = "approve" if action == "approve" else "deny"
    event = "APPROVAL_APPROVED" if action == "approve" else "APPROVAL_DENIED"
    data = {"decision": decision, "reason": REASON}
    return browser.post(reverse("approval-decide", args=[approval.pk]), data), approval.run_id, event, REASON


@pytest.mark.parametrize("where", ["own", "other"])
@pytest.mark.parametrize("action", CASE_ACTIONS + APPROVAL_ACTIONS)
@pytest.mark.parametrize("role", (*ROLES, None), ids=lambda r: r or "no-role")
def test_every_role_can_do_exactly_what_the_matrix_allows(role, action, where, acme, outsider):
    objects = {}
    for identity in (acme, outsider):
        objects[identity.tenant.slug] = (unknown_case(identity.worker), pending_approvals(identity.worker)[0])
    browser = Browser(user_with(role, acme.tenant, name="q-person"))
    target_tenant = acme.tenant.slug if where == "own" else outsider.tenant.slug
    case, approval = objects[target_tenant]
    before = snapshot()

    response, run_id, event_type, reason = perform(browser, action, case, approval)

    if where == "own" and role in MAY[action]:
        assert response.status_code == 302, response.content[:500]
        event = Event.objects.filter(run_id=run_id, type=event_type).order_by("-seq").first()
        assert event is not None
        assert event.actor == "user:q-person"
        if reason is not None:
            assert event.fields["reason"] == reason
        assert snapshot() != before
    else:
        expected = 404 if (where == "other" or role is None) else 403
        assert response.status_code == expected
        assert snapshot() == before
