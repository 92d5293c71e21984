"""POST /api/v1/runs/{run_id}/credential-leases over real HTTP."""

from datetime import datetime, timedelta

import pytest
import requests
from django.utils import timezone

from ledger.boundary import check_fields
from ledger.models import CredentialLease, Event, RunLease
from ledger.services.authority.credentials import credential_rotate
from ledger.services.authority.policy import policy_change
from tests.factories import SECRET_REF, credential

GITHUB_PAT = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0" * 2


@pytest.fixture
def leased(api_for, acme):
    """acme's client, a run it holds with token 1, and the credential github-bot."""
    client = api_for(acme)
    run_id = client.leased_run()
    credential(acme.tenant, "github-bot")
    return client, run_id


def body(**overrides):
    return {
        "fencing_token": 1,
        "principal": "github-bot",
        "actions": ["read", "comment"],
        "resources": ["repo:acme/widgets"],
        "ttl_s": 300,
        **overrides,
    }


def lease_path(run_id):
    return f"/runs/{run_id}/credential-leases"


def test_issue_returns_201_with_the_reference_version_and_expiry(leased, acme):
    client, run_id = leased
    r = client.post(lease_path(run_id), body())

    assert r.status == 201, r
    assert set(r.body) == {"lease_id", "credential_ref", "credential_version", "expires_at"}
    assert r.body["credential_ref"] == SECRET_REF
    assert r.body["credential_version"] == 1
    expires_at = datetime.fromisoformat(r.body["expires_at"].replace("Z", "+00:00"))
    assert timezone.now() + timedelta(seconds=290) < expires_at <= timezone.now() + timedelta(seconds=300)
    lease = CredentialLease.objects.get(pk=r.body["lease_id"])
    assert (str(lease.run_id), lease.actions, lease.resources) == (run_id, ["read", "comment"], ["repo:acme/widgets"])
    # Nothing credential-like in the answer, and never the worker's own bearer token.
    check_fields(r.body)
    assert acme.token not in r.raw.text


def test_a_lease_after_rotation_carries_the_new_version(leased, acme):
    client, run_id = leased
    credential_rotate(tenant=acme.tenant, principal="github-bot", rotated_by="alice", reason="leak")
    r = client.post(lease_path(run_id), body())
    assert (r.status, r.body["credential_version"]) == (201, 2), r


def test_an_old_token_gets_409_stale_token_and_no_lease(leased, api_for, acme):
    client, run_id = leased
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert client.acquire(run_id, "worker-b").body["fencing_token"] == 2

    r = client.post(lease_path(run_id), body(fencing_token=1))

    assert r.status == 409, r
    assert r.body["error"] == "STALE_TOKEN"
    assert not CredentialLease.objects.exists()
    assert Event.objects.filter(run_id=run_id, type="STALE_TOKEN_REJECTED").count() == 1


def test_an_unknown_principal_is_403_deny_policy_not_404(leased):
    client, run_id = leased
    r = client.post(lease_path(run_id), body(principal="no-such-bot"))
    assert r.status == 403, r
    assert r.body["error"] == r.body["decision"] == "DENY_POLICY"
    assert "no-such-bot" not in r.raw.text
    assert not CredentialLease.objects.exists()


def test_a_scope_the_policy_forbids_is_403_deny_policy(leased, acme):
    client, run_id = leased
    policy_change(
        tenant=acme.tenant,
        document={"rules": [{"tool": "github", "actions": ["read"], "resources": ["repo:acme/*"]}]},
        changed_by="t",
        reason="r",
    )
    assert client.post(lease_path(run_id), body(actions=["read"])).status == 201
    for overrides in ({"actions": ["read", "delete"]}, {"actions": ["read"], "resources": ["repo:globex/plans"]}):
        r = client.post(lease_path(run_id), body(**overrides))
        assert r.status == 403, r
        assert r.body["error"] == r.body["decision"] == "DENY_POLICY"
        assert "delete" not in r.raw.text and "globex" not in r.raw.text
    assert CredentialLease.objects.count() == 1


@pytest.mark.parametrize(
    "payload",
    [
        {k: v for k, v in body().items() if k != "principal"},
        body(extra="field"),
        body(fencing_token="1"),
        body(ttl_s="60"),
        body(ttl_s=0),
        body(ttl_s=366 * 86400 + 1),  # over any policy's ceiling (over the policy's own: 403 DENY_POLICY)
        body(actions=[]),
        body(actions="read"),
        body(actions=[1]),
        body(resources=[""]),
        body(resources=["repo:acme/*"]),
        body(principal=""),
        body(actions=["a"] * 51),
    ],
)
def test_invalid_requests_get_422_and_write_nothing(leased, payload):
    client, run_id = leased
    events = Event.objects.count()
    r = client.post(lease_path(run_id), payload)
    assert r.status == 422, r
    assert r.body["error"] == "VALIDATION_ERROR"
    assert not CredentialLease.objects.exists()
    assert Event.objects.count() == events


@pytest.mark.parametrize(
    "overrides",
    [
        {"resources": [f"https://api.example.com/?api_key={GITHUB_PAT}"]},
        {"actions": [GITHUB_PAT]},
        {"principal": GITHUB_PAT},
    ],
)
def test_a_credential_in_the_request_is_refused_without_echoing_it(leased, overrides):
    client, run_id = leased
    r = client.post(lease_path(run_id), body(**overrides))
    assert r.status == 422, r
    assert r.body["error"] == "FORBIDDEN_FIELD"
    assert GITHUB_PAT not in r.raw.text
    assert not CredentialLease.objects.exists()
    assert not Event.objects.filter(fields__icontains="ghp_").exists()


def test_another_tenants_run_is_404(leased, api_for, outsider):
    _, run_id = leased
    r = api_for(outsider).post(lease_path(run_id), body())
    assert r.status == 404, r
    assert r.body["error"] == "NOT_FOUND"
    assert not CredentialLease.objects.exists()


def test_an_unknown_run_is_404(leased):
    client, _ = leased
    assert client.post(lease_path("00000000-0000-4000-8000-000000000000"), body()).status == 404
    assert client.post(lease_path("not-a-run"), body()).status == 404


def test_without_a_worker_token_it_is_401(leased, api_for):
    _, run_id = leased
    r = api_for(token=None).post(lease_path(run_id), body())
    assert r.status == 401 and r.body["error"] == "UNAUTHORIZED"


def test_the_openapi_schema_documents_the_call(live_server):
    schema = requests.get(f"{live_server.url}/api/v1/openapi.json", timeout=10).json()
    call = schema["paths"]["/api/v1/runs/{run_id}/credential-leases"]["post"]
    assert {"201", "403", "404", "409", "422"} <= set(call["responses"])
