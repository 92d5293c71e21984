"""The role matrix, over real HTTP with a session and a CSRF token: every role (and a user
with none) tries every console action on its own tenant and on another tenant's object.
Allowed actions change state and leave a record naming the user and the reason (an event
in the affected run's chain; for decisions about the tenant as a whole, also an
AdminAction); refused ones are 403 (own tenant, seen but not allowed) or 404 (not
visible) and change nothing at all."""

import json

import pytest
from django.urls import reverse

from ledger.models import AdminAction, Event
from tests.factories import (
    ROLES,
    active_leases,
    leased_run,
    pending_approvals,
    stuck_resource,
    unknown_case,
    worker_in,
)
from tests.helpers import Browser, snapshot

REASON = "checked with the provider console"
OPERATOR_ACTIONS = {"claim", "resolve", "escalate", "bulk_resolve", "cancel_run"}
APPROVER_ACTIONS = {"approve", "deny"}
ADMIN_ACTIONS = {
    "revoke_lease",
    "revoke_by_principal",
    "revoke_by_prefix",
    "rotate",
    "change_policy",
    "drain",
    "quarantine",
    "resume",
    "grant_role",
    "retry_cleanup",
    "mark_released",
}
MAY = {
    **{a: {"operator", "admin"} for a in OPERATOR_ACTIONS},
    **{a: {"approver", "admin"} for a in APPROVER_ACTIONS},
    **{a: {"admin"} for a in ADMIN_ACTIONS},
}


class Target:
    """The object an action names in one tenant, made before the action, and what a
    successful action must have recorded."""

    def __init__(self, identity, action: str):
        self.identity, self.tenant, self.run_id = identity, identity.tenant, None
        self.event_type = None  # an event in run_id's chain, naming the user and reason
        self.admin_action = None  # an AdminAction of the tenant, naming the user and reason
        if action == "cancel_run":
            self.run_id = leased_run(identity.worker)[0].pk
            self.event_type = "RUN_CANCELLING"
        elif action in ("retry_cleanup", "mark_released"):
            self.resource = stuck_resource(identity.worker)
            self.run_id = self.resource.run_id
            self.event_type = {
                "retry_cleanup": "RESOURCE_RETRY_REQUESTED",
                "mark_released": "RESOURCE_MARKED_RELEASED",
            }[action]
            self.admin_action = {"retry_cleanup": "resource.retry", "mark_released": "resource.mark_released"}[action]
        elif action in OPERATOR_ACTIONS:
            self.case = unknown_case(identity.worker)
            self.run_id = self.case.run_id
            self.event_type = {"claim": "CASE_CLAIMED", "escalate": "CASE_ESCALATED"}.get(
                action, "OPERATION_RECONCILED"
            )
        elif action in APPROVER_ACTIONS:
            self.approval = pending_approvals(identity.worker)[0]
            self.run_id = self.approval.run_id
            self.event_type = "APPROVAL_APPROVED" if action == "approve" else "APPROVAL_DENIED"
        elif action.startswith("revoke") or action == "rotate":
            (self.lease,) = active_leases(identity, 1)
            self.run_id = self.lease.run_id
            self.event_type = "CREDENTIAL_ROTATED" if action == "rotate" else "CREDENTIAL_LEASE_REVOKED"
            self.admin_action = "credential.rotate" if action == "rotate" else "credential_lease.revoke"
        elif action in ("drain", "quarantine", "resume"):
            self.worker = worker_in(self.tenant, "QUARANTINED" if action == "resume" else "ACCEPTING", f"w-{action}")
            if action != "resume":
                self.run_id = leased_run(self.worker)[0].pk
                self.event_type = {"drain": "WORKER_DRAINING", "quarantine": "WORKER_QUARANTINED"}[action]
            self.admin_action = f"worker.{action}"
        elif action == "change_policy":
            self.admin_action = "policy.change"
        elif action == "grant_role":
            self.admin_action = "role.grant"


def perform(browser: Browser, action: str, t: Target):
    """The POST(s) a person makes for ``action`` on ``t``; returns the final response."""
    slug = t.tenant.slug
    if action == "cancel_run":
        return browser.post(reverse("run-cancel", args=[t.run_id]), {"reason": REASON})
    if action in ("retry_cleanup", "mark_released"):
        verb = "retry" if action == "retry_cleanup" else "mark_released"
        return browser.post(reverse("resource-act", args=[t.resource.pk]), {"action": verb, "reason": REASON})
    if action == "claim":
        return browser.post(reverse("case-claim", args=[t.case.pk]))
    if action == "resolve":
        data = {"resolution": "HAPPENED", "provider_request_id": "prov-991", "reason": REASON}
        return browser.post(reverse("case-resolve", args=[t.case.pk]), data)
    if action == "escalate":
        return browser.post(reverse("case-escalate", args=[t.case.pk]), {"reason": REASON})
    if action == "bulk_resolve":
        data = {"case": [str(t.case.pk)], "resolution": "COMPENSATED", "reason": REASON}
        preview = browser.post(reverse("cases-bulk"), data)
        if preview.status_code != 200:
            return preview
        assert str(t.case.pk) in preview.content.decode()
        return browser.post(reverse("cases-bulk"), {**data, "confirm": "1"})
    if action in APPROVER_ACTIONS:
        return browser.post(reverse("approval-decide", args=[t.approval.pk]), {"decision": action, "reason": REASON})
    if action.startswith("revoke"):
        selection = {
            "revoke_lease": {"lease": str(t.lease.pk)},
            "revoke_by_principal": {"principal": "github-bot"},
            "revoke_by_prefix": {"prefix": str(t.lease.pk)[:8]},
        }[action]
        preview = browser.get(reverse("credential-revoke-preview"), {"tenant": slug, **selection})
        if preview.status_code != 200:
            return preview
        assert str(t.lease.pk) in preview.content.decode()
        return browser.post(reverse("credential-revoke"), {"tenant": slug, **selection, "reason": REASON})
    if action == "rotate":
        return browser.post(reverse("credential-rotate"), {"tenant": slug, "principal": "github-bot", "reason": REASON})
    if action == "change_policy":
        document = json.dumps({"human_approval_tools": ["payments"]})
        return browser.post(reverse("tenant-policy", args=[slug]), {"document": document, "reason": REASON})
    if action == "grant_role":
        return browser.post(
            reverse("tenant-grant", args=[slug]), {"username": "newcomer", "role": "viewer", "reason": REASON}
        )
    return browser.post(reverse("worker-act", args=[t.worker.pk]), {"action": action, "reason": REASON})


@pytest.mark.parametrize("where", ["own", "other"])
@pytest.mark.parametrize("action", sorted(OPERATOR_ACTIONS) + sorted(APPROVER_ACTIONS) + sorted(ADMIN_ACTIONS))
@pytest.mark.parametrize("role", [*ROLES, None], ids=lambda r: r or "no-role")
def test_every_role_can_do_exactly_what_the_matrix_allows(role, action, where, acme, outsider, people):
    target = Target(acme if where == "own" else outsider, action)
    browser = Browser(people[role])
    before = snapshot()

    response = perform(browser, action, target)

    if where == "own" and role in MAY[action]:
        assert response.status_code == 302, response.content[:800]
        if target.event_type is not None:
            event = Event.objects.filter(run_id=target.run_id, type=target.event_type).order_by("-seq").first()
            assert event is not None, f"no {target.event_type} in the run's chain"
            assert event.actor == f"user:{browser.user.username}"
            if action != "claim":
                assert event.fields["reason"] == REASON
        if target.admin_action is not None:
            record = AdminAction.objects.filter(tenant=target.tenant, action=target.admin_action).latest("occurred_at")
            assert (record.actor, record.reason) == (f"user:{browser.user.username}", REASON)
        assert snapshot() != before
    else:
        expected = 404 if (where == "other" or role is None) else 403
        assert response.status_code == expected, response.content[:800]
        assert snapshot() == before
