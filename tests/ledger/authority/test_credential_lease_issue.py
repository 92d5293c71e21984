"""Issuing a credential lease under the fence (ledger/services/authority/credential_leases.py):
the current version for the exact scope the policy's rules allow, recorded in the run's chain;
a stale token, an unknown principal, a forbidden scope, a bad ttl, a quarantined worker and
another tenant's run are refused."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.errors import Denied, ForbiddenField, InvalidInput, NotFound, StaleToken, WorkerNotAccepting
from ledger.models import CredentialLease, Worker
from ledger.services.fence.leases import lease_acquire
from ledger.states import WorkerStatus
from tests.factories import GITHUB_PAT, credential_lease, expire, leased_run, set_policy
from tests.helpers import assert_chain_intact, events_of

# --- issue --------------------------------------------------------------------------------


def test_issue_lends_the_current_version_for_the_exact_scope_and_records_it(acme, bot):
    run, token = leased_run(acme.worker)
    before = timezone.now()
    lease = credential_lease(
        acme, run, token, actions=["read", "comment", "read"], resources=["repo:acme/widgets"], ttl_s=120
    )

    lease.refresh_from_db()
    assert lease.run_id == run.pk and lease.tenant_id == acme.tenant.pk and lease.credential_id == bot.pk
    assert lease.version == 1
    assert lease.actions == ["read", "comment"]  # duplicates dropped, order kept
    assert lease.resources == ["repo:acme/widgets"]
    assert lease.revoked_at is None
    assert before + timedelta(seconds=119) < lease.expires_at <= timezone.now() + timedelta(seconds=120)

    (event,) = events_of(run, "CREDENTIAL_LEASE_ISSUED")
    assert event.actor == "worker:worker-1/owner-a"
    assert event.fields["lease_id"] == str(lease.pk)
    assert event.fields["principal"] == "github-bot"
    assert event.fields["version"] == 1
    assert event.fields["actions"] == ["read", "comment"]
    assert event.fields["resources"] == ["repo:acme/widgets"]
    assert set(event.fields) == {
        "lease_id",
        "principal",
        "version",
        "actions",
        "resources",
        "expires_at",
        "policy_version",
    }
    assert_chain_intact(run.pk)


def test_issue_under_a_stale_token_is_refused_and_counted(acme, bot):
    run, old_token = leased_run(acme.worker)
    expire(run)
    new_token = lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=30).fencing_token

    with pytest.raises(StaleToken):
        credential_lease(acme, run, old_token)

    assert not CredentialLease.objects.exists()
    (refusal,) = events_of(run, "STALE_TOKEN_REJECTED")
    assert refusal.fields["attempted"] == "credential_lease.issue"
    assert (refusal.fields["presented_token"], refusal.fields["current_token"]) == (old_token, new_token)
    run.refresh_from_db()
    assert run.stale_rejections == 1
    assert_chain_intact(run.pk)


def test_stale_token_wins_over_an_unknown_principal(acme):
    run, token = leased_run(acme.worker)
    with pytest.raises(StaleToken):
        credential_lease(acme, run, token + 1, principal="nobody")


def test_issue_for_an_unknown_principal_is_deny_policy_not_not_found(acme, bot):
    run, token = leased_run(acme.worker)
    with pytest.raises(Denied) as denied:
        credential_lease(acme, run, token, principal="no-such-bot")
    assert denied.value.code == "DENY_POLICY"
    assert "no-such-bot" not in denied.value.detail
    assert not CredentialLease.objects.exists()
    (event,) = events_of(run, "CREDENTIAL_LEASE_DENIED")
    assert event.fields["decision"] == "DENY_POLICY"
    assert_chain_intact(run.pk)


def test_issue_is_deny_policy_for_an_action_or_resource_the_policy_forbids(acme, bot):
    set_policy(acme.tenant, rules=[{"tool": "github", "actions": ["read", "comment"], "resources": ["repo:acme/*"]}])
    run, token = leased_run(acme.worker)

    assert credential_lease(acme, run, token, actions=["read", "comment"], resources=["repo:acme/widgets"]).version == 1
    for actions, resources in [
        (["read", "delete"], ["repo:acme/widgets"]),
        (["read"], ["repo:acme/widgets", "repo:globex/secret-plans"]),
    ]:
        with pytest.raises(Denied) as denied:
            credential_lease(acme, run, token, actions=actions, resources=resources)
        assert denied.value.code == "DENY_POLICY"
        assert "delete" not in denied.value.detail and "globex" not in denied.value.detail
    assert CredentialLease.objects.count() == 1
    assert len(events_of(run, "CREDENTIAL_LEASE_DENIED")) == 2


def test_each_action_resource_pair_needs_one_tool_that_may_use_it(acme, bot):
    # "read" is allowed on repos and "send" on mailboxes, but no tool may "send" on a repo.
    set_policy(
        acme.tenant,
        rules=[
            {"tool": "github", "actions": ["read"], "resources": ["repo:*"]},
            {"tool": "email", "actions": ["send"], "resources": ["mailto:*"]},
        ],
    )
    run, token = leased_run(acme.worker)
    assert credential_lease(acme, run, token, actions=["send"], resources=["mailto:ops@example.com"])
    with pytest.raises(Denied):
        credential_lease(acme, run, token, actions=["read", "send"], resources=["repo:acme/widgets"])


def test_a_rule_shadowed_by_an_earlier_one_grants_nothing(acme, bot):
    # First rule naming the tool wins: the second rule is never reached for any tool.
    set_policy(
        acme.tenant,
        rules=[
            {"tool": "*", "actions": ["read"], "resources": ["*"]},
            {"tool": "github", "actions": ["*"], "resources": ["*"]},
        ],
    )
    run, token = leased_run(acme.worker)
    assert credential_lease(acme, run, token, actions=["read"])
    with pytest.raises(Denied):
        credential_lease(acme, run, token, actions=["write"])


def test_an_empty_rule_list_denies_every_lease(acme, bot):
    set_policy(acme.tenant, rules=[])
    run, token = leased_run(acme.worker)
    with pytest.raises(Denied):
        credential_lease(acme, run, token)


def test_ttl_runs_from_1_to_the_policy_max(acme, bot):
    run, token = leased_run(acme.worker)
    assert credential_lease(acme, run, token, ttl_s=1)
    assert credential_lease(acme, run, token, ttl_s=3600)  # the starter policy's max_ttl_s
    for ttl_s in (0, -5, 366 * 86400 + 1, True, 1.5, "60"):
        with pytest.raises(InvalidInput, match="ttl_s"):
            credential_lease(acme, run, token, ttl_s=ttl_s)
    with pytest.raises(Denied, match="max_ttl_s") as over:  # longer than the policy allows: its refusal
        credential_lease(acme, run, token, ttl_s=3601)
    assert over.value.code == "DENY_POLICY"

    set_policy(acme.tenant, rules=[{"tool": "*", "actions": ["*"], "resources": ["*"]}], max_ttl_s=60)
    assert credential_lease(acme, run, token, ttl_s=60)
    with pytest.raises(Denied, match=r"max_ttl_s \(60 s\)"):
        credential_lease(acme, run, token, ttl_s=61)
    assert CredentialLease.objects.count() == 3


@pytest.mark.parametrize(
    "actions, resources, error",
    [
        ([], ["repo:a"], InvalidInput),
        (["read"], [], InvalidInput),
        ("read", ["repo:a"], InvalidInput),
        (["read", 7], ["repo:a"], InvalidInput),
        ([""], ["repo:a"], InvalidInput),
        (["*"], ["repo:a"], InvalidInput),
        (["read"], ["repo:acme/*"], InvalidInput),
        (["read"] * 51, ["repo:a"], InvalidInput),
        (["read"], ["https://x.example.com/?access_token=abc123def"], ForbiddenField),
        (["read"], [GITHUB_PAT], ForbiddenField),
    ],
)
def test_issue_refuses_a_scope_that_is_not_a_list_of_exact_clean_strings(acme, bot, actions, resources, error):
    run, token = leased_run(acme.worker)
    with pytest.raises(error):
        credential_lease(acme, run, token, actions=actions, resources=resources)
    assert not CredentialLease.objects.exists()


def test_a_quarantined_worker_gets_no_credential(acme, bot):
    run, token = leased_run(acme.worker)
    Worker.objects.filter(pk=acme.worker.pk).update(status=WorkerStatus.QUARANTINED)
    acme.worker.refresh_from_db()
    with pytest.raises(WorkerNotAccepting):
        credential_lease(acme, run, token)
    assert not CredentialLease.objects.exists()


def test_another_tenants_run_is_not_found(acme, bot, outsider):
    run, token = leased_run(acme.worker)
    with pytest.raises(NotFound):
        credential_lease(outsider, run, token)
