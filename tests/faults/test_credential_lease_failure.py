"""The Credential Lease article's failure test, over HTTP: a call queued under a lease that
is revoked and rotated while the worker pauses is refused at dispatch; an accepted call whose
response times out is UNKNOWN and is reconciled by the provider's request id before any retry."""

import pytest

from approvals.models import ReconciliationCase
from approvals.services.cases import case_resolve
from ledger.models import Event, Operation
from ledger.services.authority.credential_leases import credential_lease_revoke
from ledger.services.authority.credentials import credential_create, credential_rotate
from ledger.services.authority.policy import policy_change

PRINCIPAL = "github-bot"
RESOURCE = "repo:acme/api"


@pytest.fixture
def credentialed(api_for, acme):
    policy_change(
        tenant=acme.tenant, document={"require_credential": True}, changed_by="admin", reason="leases for all"
    )
    credential_create(tenant=acme.tenant, principal=PRINCIPAL, secret_ref="vault:kv/github-bot")
    client = api_for(acme)
    run_id = client.create_run()
    client.acquire(run_id, "worker-a", ttl_s=600)
    return client, run_id


def lease(client, run_id, token=1):
    body = {
        "fencing_token": token,
        "principal": PRINCIPAL,
        "actions": ["create_issue"],
        "resources": [RESOURCE],
        "ttl_s": 600,
    }
    issued = client.post(f"/runs/{run_id}/credential-leases", body)
    assert issued.status == 201, issued
    return issued.body


def queued_call(client, run_id, key, lease_id):
    op = client.intend(
        run_id, 1, key, tool="github", action="create_issue", resource=RESOURCE, effect_class="IDEMPOTENT"
    )
    op_id = op.body["operation_id"]
    allowed = client.post(f"/operations/{op_id}/authorize", {"fencing_token": 1, "credential_lease_id": lease_id})
    assert allowed.body == {"decision": "ALLOW", "phase": "AUTHORIZED"}, allowed
    return op_id


def test_revoked_and_rotated_while_paused_the_dispatch_is_denied(credentialed, acme):
    client, run_id = credentialed
    issued = lease(client, run_id)
    assert (issued["credential_ref"], issued["credential_version"]) == ("vault:kv/github-bot", 1)
    op_id = queued_call(client, run_id, "issue:1", issued["lease_id"])

    # The worker pauses before dispatch; an admin rotates the credential and revokes the lease.
    credential_rotate(tenant=acme.tenant, principal=PRINCIPAL, rotated_by="admin-ann", reason="leaked in a log")
    credential_lease_revoke(
        tenant=acme.tenant, lease_id=issued["lease_id"], revoked_by="admin-ann", reason="leaked in a log"
    )

    resumed = client.dispatch(op_id, 1)
    assert resumed.status == 403 and resumed.body["error"] in ("DENY_REVOKED", "DENY_STALE_VERSION")
    assert resumed.body["error"] == resumed.body["decision"] == "DENY_REVOKED"  # revocation is checked first
    assert Operation.objects.get(pk=op_id).phase == "DENIED"
    revoked = Event.objects.get(run_id=run_id, type="CREDENTIAL_LEASE_REVOKED")
    assert (revoked.actor, revoked.fields["reason"]) == ("user:admin-ann", "leaked in a log")
    assert Event.objects.filter(run_id=run_id, type="CREDENTIAL_ROTATED").count() == 1


def test_rotated_while_paused_the_dispatch_is_denied_as_stale(credentialed, acme):
    client, run_id = credentialed
    issued = lease(client, run_id)
    op_id = queued_call(client, run_id, "issue:2", issued["lease_id"])
    credential_rotate(tenant=acme.tenant, principal=PRINCIPAL, rotated_by="admin-ann", reason="scheduled rotation")
    resumed = client.dispatch(op_id, 1)
    assert (resumed.status, resumed.body["error"]) == (403, "DENY_STALE_VERSION")


def test_accepted_but_timed_out_is_unknown_and_reconciled_by_provider_id_before_any_retry(credentialed, acme):
    client, run_id = credentialed
    issued = lease(client, run_id)
    op_id = queued_call(client, run_id, "issue:3", issued["lease_id"])
    assert client.dispatch(op_id, 1).status == 200
    # The provider accepted; the response timed out.
    assert client.outcome(op_id, 1, "UNKNOWN", error_code="READ_TIMEOUT").body == {"phase": "UNKNOWN"}
    refused = client.post(f"/operations/{op_id}/retry", {"fencing_token": 1})
    assert (refused.status, refused.body["error"]) == (409, "RECONCILE_FIRST")

    case = ReconciliationCase.objects.get(operation_id=op_id, status="OPEN")
    case_resolve(
        case_id=case.pk,
        resolved_by="olivia",
        resolution="HAPPENED",
        provider_request_id="gh-issue-991",
        reason="provider lookup by idempotency key found issue 991",
    )
    op = Operation.objects.get(pk=op_id)
    assert (op.phase, op.reconciliation, op.provider_request_id) == ("RECONCILED", "HAPPENED", "gh-issue-991")
    assert client.get(f"/operations/{op_id}/retry-decision").body["decision"] == "STOP"
    assert client.post(f"/operations/{op_id}/retry", {"fencing_token": 1}).body["error"] == "WRONG_PHASE"
    reconciled = Event.objects.get(run_id=run_id, type="OPERATION_RECONCILED")
    assert reconciled.actor == "user:olivia"
    assert reconciled.fields["resolution"] == "HAPPENED"
    assert ReconciliationCase.objects.get(pk=case.pk).status == "RESOLVED"
