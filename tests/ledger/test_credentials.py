"""Credentials and credential leases at the service level: create, rotate, issue, revoke
(one, by principal, by prefix, preview), the events each decision leaves in the affected
runs' chains, and the management commands over the same services."""

import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from ledger import admin_selectors
from ledger.errors import Denied, ForbiddenField, InvalidInput, NotFound, StaleToken, WorkerNotAccepting
from ledger.models import Credential, CredentialLease, Event, Worker
from ledger.services.authority import credential_leases, credentials
from ledger.services.authority.policy import policy_change
from ledger.services.fence.leases import lease_acquire
from ledger.states import WorkerStatus
from tests.factories import expire, leased_run
from tests.helpers import assert_chain_intact, run_concurrently

SECRET_REF = "vault:kv/github-bot"
GITHUB_PAT = "ghp_" + "A1b2C3d4E5f6G7h8I9j0" * 2


def issue(identity, run, token, principal="github-bot", actions=None, resources=None, ttl_s=60):
    return credential_leases.credential_lease_issue(
        worker=identity.worker,
        run_id=run.pk,
        fencing_token=token,
        principal=principal,
        actions=["read"] if actions is None else actions,
        resources=["repo:acme/widgets"] if resources is None else resources,
        ttl_s=ttl_s,
    )


def events_of(run, type):
    return list(Event.objects.filter(run=run, type=type).order_by("seq"))


def set_rules(tenant, rules, **document):
    policy_change(tenant=tenant, document={"rules": rules, **document}, changed_by="t", reason="r")


@pytest.fixture
def bot(acme):
    return credentials.credential_create(tenant=acme.tenant, principal="github-bot", secret_ref=SECRET_REF)


# --- create -------------------------------------------------------------------------------


def test_create_keeps_only_the_reference_at_version_1(acme):
    credential = credentials.credential_create(tenant=acme.tenant, principal="github-bot", secret_ref=SECRET_REF)
    credential.refresh_from_db()
    assert (credential.principal, credential.version, credential.secret_ref) == ("github-bot", 1, SECRET_REF)
    assert credential.rotated_at is None


@pytest.mark.parametrize(
    "secret_ref",
    [
        GITHUB_PAT,
        "vault:" + GITHUB_PAT,
        "https://deploy:hunter2@vault.example.com/kv",
        "env:API_KEY=abcdef123",
        "sk-proj-" + "x1" * 20,
    ],
)
def test_create_refuses_a_secret_looking_reference_without_echoing_it(acme, secret_ref):
    with pytest.raises(ForbiddenField) as refused:
        credentials.credential_create(tenant=acme.tenant, principal="github-bot", secret_ref=secret_ref)
    assert refused.value.path == "secret_ref"
    assert secret_ref not in refused.value.detail
    assert not Credential.objects.exists()


@pytest.mark.parametrize("secret_ref", ["hunter2", "", "vault:", "Vault:kv/x", "vault:kv/has space"])
def test_create_refuses_a_value_that_is_not_a_reference(acme, secret_ref):
    with pytest.raises(InvalidInput, match="secret_ref"):
        credentials.credential_create(tenant=acme.tenant, principal="github-bot", secret_ref=secret_ref)
    assert not Credential.objects.exists()


def test_create_refuses_a_second_credential_for_the_same_principal(acme, bot, outsider):
    with pytest.raises(InvalidInput, match="already exists"):
        credentials.credential_create(tenant=acme.tenant, principal="github-bot", secret_ref="vault:kv/other")
    # Another tenant may use the same principal name.
    assert (
        credentials.credential_create(tenant=outsider.tenant, principal="github-bot", secret_ref=SECRET_REF).version
        == 1
    )


@pytest.mark.parametrize("principal", [GITHUB_PAT, "has space", "", "-leading-dash", "x" * 201])
def test_create_refuses_a_bad_principal(acme, principal):
    with pytest.raises((InvalidInput, ForbiddenField)):
        credentials.credential_create(tenant=acme.tenant, principal=principal, secret_ref=SECRET_REF)


# --- issue --------------------------------------------------------------------------------


def test_issue_lends_the_current_version_for_the_exact_scope_and_records_it(acme, bot):
    run, token = leased_run(acme.worker)
    before = timezone.now()
    lease = issue(acme, run, token, actions=["read", "comment", "read"], resources=["repo:acme/widgets"], ttl_s=120)

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
        issue(acme, run, old_token)

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
        issue(acme, run, token + 1, principal="nobody")


def test_issue_for_an_unknown_principal_is_deny_policy_not_not_found(acme, bot):
    run, token = leased_run(acme.worker)
    with pytest.raises(Denied) as denied:
        issue(acme, run, token, principal="no-such-bot")
    assert denied.value.code == "DENY_POLICY"
    assert "no-such-bot" not in denied.value.detail
    assert not CredentialLease.objects.exists()
    (event,) = events_of(run, "CREDENTIAL_LEASE_DENIED")
    assert event.fields["decision"] == "DENY_POLICY"
    assert_chain_intact(run.pk)


def test_issue_is_deny_policy_for_an_action_or_resource_the_policy_forbids(acme, bot):
    set_rules(acme.tenant, [{"tool": "github", "actions": ["read", "comment"], "resources": ["repo:acme/*"]}])
    run, token = leased_run(acme.worker)

    assert issue(acme, run, token, actions=["read", "comment"], resources=["repo:acme/widgets"]).version == 1
    for actions, resources in [
        (["read", "delete"], ["repo:acme/widgets"]),
        (["read"], ["repo:acme/widgets", "repo:globex/secret-plans"]),
    ]:
        with pytest.raises(Denied) as denied:
            issue(acme, run, token, actions=actions, resources=resources)
        assert denied.value.code == "DENY_POLICY"
        assert "delete" not in denied.value.detail and "globex" not in denied.value.detail
    assert CredentialLease.objects.count() == 1
    assert len(events_of(run, "CREDENTIAL_LEASE_DENIED")) == 2


def test_each_action_resource_pair_needs_one_tool_that_may_use_it(acme, bot):
    # "read" is allowed on repos and "send" on mailboxes, but no tool may "send" on a repo.
    set_rules(
        acme.tenant,
        [
            {"tool": "github", "actions": ["read"], "resources": ["repo:*"]},
            {"tool": "email", "actions": ["send"], "resources": ["mailto:*"]},
        ],
    )
    run, token = leased_run(acme.worker)
    assert issue(acme, run, token, actions=["send"], resources=["mailto:ops@example.com"])
    with pytest.raises(Denied):
        issue(acme, run, token, actions=["read", "send"], resources=["repo:acme/widgets"])


def test_a_rule_shadowed_by_an_earlier_one_grants_nothing(acme, bot):
    # First rule naming the tool wins: the second rule is never reached for any tool.
    set_rules(
        acme.tenant,
        [
            {"tool": "*", "actions": ["read"], "resources": ["*"]},
            {"tool": "github", "actions": ["*"], "resources": ["*"]},
        ],
    )
    run, token = leased_run(acme.worker)
    assert issue(acme, run, token, actions=["read"])
    with pytest.raises(Denied):
        issue(acme, run, token, actions=["write"])


def test_an_empty_rule_list_denies_every_lease(acme, bot):
    set_rules(acme.tenant, [])
    run, token = leased_run(acme.worker)
    with pytest.raises(Denied):
        issue(acme, run, token)


def test_ttl_runs_from_1_to_the_policy_max(acme, bot):
    run, token = leased_run(acme.worker)
    assert issue(acme, run, token, ttl_s=1)
    assert issue(acme, run, token, ttl_s=3600)  # the starter policy's max_ttl_s
    for ttl_s in (0, -5, 366 * 86400 + 1, True, 1.5, "60"):
        with pytest.raises(InvalidInput, match="ttl_s"):
            issue(acme, run, token, ttl_s=ttl_s)
    with pytest.raises(Denied, match="max_ttl_s") as over:  # longer than the policy allows: its refusal
        issue(acme, run, token, ttl_s=3601)
    assert over.value.code == "DENY_POLICY"

    set_rules(acme.tenant, [{"tool": "*", "actions": ["*"], "resources": ["*"]}], max_ttl_s=60)
    assert issue(acme, run, token, ttl_s=60)
    with pytest.raises(Denied, match=r"max_ttl_s \(60 s\)"):
        issue(acme, run, token, ttl_s=61)
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
        issue(acme, run, token, actions=actions, resources=resources)
    assert not CredentialLease.objects.exists()


def test_a_quarantined_worker_gets_no_credential(acme, bot):
    run, token = leased_run(acme.worker)
    Worker.objects.filter(pk=acme.worker.pk).update(status=WorkerStatus.QUARANTINED)
    acme.worker.refresh_from_db()
    with pytest.raises(WorkerNotAccepting):
        issue(acme, run, token)
    assert not CredentialLease.objects.exists()


def test_another_tenants_run_is_not_found(acme, bot, outsider):
    run, token = leased_run(acme.worker)
    with pytest.raises(NotFound):
        issue(outsider, run, token)


# --- rotate -------------------------------------------------------------------------------


def test_rotate_bumps_the_version_and_tells_each_run_holding_an_active_lease(acme, bot):
    credentials.credential_create(tenant=acme.tenant, principal="slack-bot", secret_ref="vault:kv/slack-bot")
    holding, t1 = leased_run(acme.worker, owner="a")
    holding_twice, t2 = leased_run(acme.worker, owner="b")
    expired_only, t3 = leased_run(acme.worker, owner="c")
    revoked_only, t4 = leased_run(acme.worker, owner="d")
    other_principal, t5 = leased_run(acme.worker, owner="e")
    issue(acme, holding, t1)
    issue(acme, holding_twice, t2)
    issue(acme, holding_twice, t2, actions=["comment"])
    old = issue(acme, expired_only, t3)
    CredentialLease.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    gone = issue(acme, revoked_only, t4)
    credential_leases.credential_lease_revoke(tenant=acme.tenant, lease_id=gone.pk, revoked_by="bob", reason="done")
    issue(acme, other_principal, t5, principal="slack-bot")

    rotated = credentials.credential_rotate(
        tenant=acme.tenant, principal="github-bot", rotated_by="alice", reason="key leaked in CI log"
    )

    assert rotated.credential.version == 2
    bot.refresh_from_db()
    assert bot.version == 2 and bot.rotated_at is not None
    assert sorted(map(str, rotated.affected_run_ids)) == sorted([str(holding.pk), str(holding_twice.pk)])
    for run in (holding, holding_twice):
        (event,) = events_of(run, "CREDENTIAL_ROTATED")
        assert event.actor == "user:alice"
        assert event.fields == {"principal": "github-bot", "version": 2, "reason": "key leaked in CI log"}
        assert_chain_intact(run.pk)
    for run in (expired_only, revoked_only, other_principal):
        assert events_of(run, "CREDENTIAL_ROTATED") == []
    # Old leases keep the version they were issued on (the authority checks call them
    # stale); a new lease gets the new version.
    assert set(CredentialLease.objects.filter(credential=bot).values_list("version", flat=True)) == {1}
    assert issue(acme, holding, t1).version == 2


def test_rotate_twice_gives_two_versions(acme, bot):
    credentials.credential_rotate(tenant=acme.tenant, principal="github-bot", rotated_by="alice", reason="one")
    assert (
        credentials.credential_rotate(
            tenant=acme.tenant, principal="github-bot", rotated_by="alice", reason="two"
        ).credential.version
        == 3
    )


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"principal": "nobody"}, NotFound),
        ({"reason": ""}, InvalidInput),
        ({"reason": "   "}, InvalidInput),
        ({"rotated_by": ""}, InvalidInput),
        ({"reason": "new key is " + GITHUB_PAT}, ForbiddenField),
        ({"rotated_by": GITHUB_PAT}, ForbiddenField),
    ],
)
def test_rotate_names_an_existing_principal_a_user_and_a_clean_reason(acme, bot, kwargs, error):
    args = {"tenant": acme.tenant, "principal": "github-bot", "rotated_by": "alice", "reason": "leak", **kwargs}
    with pytest.raises(error):
        credentials.credential_rotate(**args)
    bot.refresh_from_db()
    assert bot.version == 1


def test_rotate_is_scoped_to_the_tenant(acme, bot, outsider):
    with pytest.raises(NotFound):
        credentials.credential_rotate(tenant=outsider.tenant, principal="github-bot", rotated_by="mallory", reason="x")
    bot.refresh_from_db()
    assert bot.version == 1


# --- revoke -------------------------------------------------------------------------------


def test_revoke_one_records_user_and_reason_in_the_leases_run(acme, bot):
    run, token = leased_run(acme.worker)
    lease = issue(acme, run, token)

    revoked = credential_leases.credential_lease_revoke(
        tenant=acme.tenant, lease_id=str(lease.pk), revoked_by="bob", reason="suspicious use"
    )

    assert revoked.revoked_now
    lease.refresh_from_db()
    assert lease.revoked_at is not None and (lease.revoked_by, lease.revoke_reason) == ("bob", "suspicious use")
    (event,) = events_of(run, "CREDENTIAL_LEASE_REVOKED")
    assert event.actor == "user:bob"
    assert event.fields == {"lease_id": str(lease.pk), "principal": "github-bot", "reason": "suspicious use"}
    assert_chain_intact(run.pk)


def test_revoking_twice_changes_nothing_the_second_time(acme, bot):
    run, token = leased_run(acme.worker)
    lease = issue(acme, run, token)
    credential_leases.credential_lease_revoke(tenant=acme.tenant, lease_id=lease.pk, revoked_by="bob", reason="first")
    first = CredentialLease.objects.get(pk=lease.pk)

    again = credential_leases.credential_lease_revoke(
        tenant=acme.tenant, lease_id=lease.pk, revoked_by="carol", reason="second"
    )

    assert not again.revoked_now
    assert (again.lease.revoked_at, again.lease.revoked_by, again.lease.revoke_reason) == (
        first.revoked_at,
        "bob",
        "first",
    )
    assert len(events_of(run, "CREDENTIAL_LEASE_REVOKED")) == 1
    assert (
        len(
            credential_leases.credential_leases_revoke(
                tenant=acme.tenant, principal="github-bot", revoked_by="c", reason="r"
            )
        )
        == 0
    )


def test_revoke_one_also_takes_an_expired_lease(acme, bot):
    run, token = leased_run(acme.worker)
    lease = issue(acme, run, token)
    CredentialLease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert credential_leases.credential_lease_revoke(
        tenant=acme.tenant, lease_id=lease.pk, revoked_by="bob", reason="r"
    ).revoked_now


@pytest.mark.parametrize("lease_id", ["not-a-uuid", "0b6f3a52-8f4e-4d0a-9d7e-3c1f2a9b8c7d"])
def test_revoke_one_of_an_unknown_lease_is_not_found(acme, lease_id):
    with pytest.raises(NotFound):
        credential_leases.credential_lease_revoke(tenant=acme.tenant, lease_id=lease_id, revoked_by="bob", reason="r")


def test_revoke_one_of_another_tenants_lease_is_not_found(acme, bot, outsider):
    run, token = leased_run(acme.worker)
    lease = issue(acme, run, token)
    with pytest.raises(NotFound):
        credential_leases.credential_lease_revoke(
            tenant=outsider.tenant, lease_id=lease.pk, revoked_by="mallory", reason="r"
        )
    lease.refresh_from_db()
    assert lease.revoked_at is None


def test_revoke_by_principal_takes_every_active_lease_of_it_and_only_those(acme, bot):
    credentials.credential_create(tenant=acme.tenant, principal="slack-bot", secret_ref="vault:kv/slack-bot")
    run_a, ta = leased_run(acme.worker, owner="a")
    run_b, tb = leased_run(acme.worker, owner="b")
    a1, a2 = issue(acme, run_a, ta), issue(acme, run_a, ta, actions=["comment"])
    b1 = issue(acme, run_b, tb)
    expired = issue(acme, run_b, tb, actions=["comment"])
    CredentialLease.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    other = issue(acme, run_b, tb, principal="slack-bot")

    preview = admin_selectors.credential_leases_matching(tenant=acme.tenant, principal="github-bot")
    assert {lease.pk for lease in preview} == {a1.pk, a2.pk, b1.pk}
    assert events_of(run_a, "CREDENTIAL_LEASE_REVOKED") == []  # a preview changes nothing

    count = len(
        credential_leases.credential_leases_revoke(
            tenant=acme.tenant, principal="github-bot", revoked_by="alice", reason="bot compromised"
        )
    )

    assert count == 3
    assert set(CredentialLease.objects.filter(revoked_at__isnull=False).values_list("pk", flat=True)) == {
        a1.pk,
        a2.pk,
        b1.pk,
    }
    assert {e.fields["lease_id"] for e in events_of(run_a, "CREDENTIAL_LEASE_REVOKED")} == {str(a1.pk), str(a2.pk)}
    assert [e.fields["lease_id"] for e in events_of(run_b, "CREDENTIAL_LEASE_REVOKED")] == [str(b1.pk)]
    for run in (run_a, run_b):
        for event in events_of(run, "CREDENTIAL_LEASE_REVOKED"):
            assert event.actor == "user:alice" and event.fields["reason"] == "bot compromised"
        assert_chain_intact(run.pk)
    other.refresh_from_db()
    assert other.revoked_at is None
    assert (
        len(
            credential_leases.credential_leases_revoke(
                tenant=acme.tenant, principal="github-bot", revoked_by="alice", reason="again"
            )
        )
        == 0
    )


def test_revoke_by_an_unknown_principal_is_not_found(acme):
    with pytest.raises(NotFound):
        len(
            credential_leases.credential_leases_revoke(
                tenant=acme.tenant, principal="nobody", revoked_by="a", reason="r"
            )
        )


def test_revoke_by_prefix_takes_the_leases_whose_id_starts_with_it(acme, bot):
    run, token = leased_run(acme.worker)
    leases = [issue(acme, run, token, actions=[f"a{i}"]) for i in range(3)]
    target = str(leases[0].pk)

    for prefix in (target[:13], target[:13].upper(), target[:13].replace("-", "")):
        assert [
            lease.pk for lease in admin_selectors.credential_leases_matching(tenant=acme.tenant, prefix=prefix)
        ] == [leases[0].pk]

    assert (
        len(
            credential_leases.credential_leases_revoke(
                tenant=acme.tenant, prefix=target[:13], revoked_by="alice", reason="r"
            )
        )
        == 1
    )
    assert [e.fields["lease_id"] for e in events_of(run, "CREDENTIAL_LEASE_REVOKED")] == [target]
    assert CredentialLease.objects.filter(revoked_at__isnull=True).count() == 2
    assert (
        len(
            credential_leases.credential_leases_revoke(
                tenant=acme.tenant, prefix=target, revoked_by="alice", reason="r"
            )
        )
        == 0
    )


def test_a_prefix_shared_by_every_lease_revokes_them_all(acme, bot):
    run, token = leased_run(acme.worker)
    issue(acme, run, token)
    CredentialLease.objects.update(id=uuid.UUID("abcd0000-0000-4000-8000-000000000001"))
    issue(acme, run, token)
    CredentialLease.objects.exclude(pk=uuid.UUID("abcd0000-0000-4000-8000-000000000001")).update(
        id=uuid.UUID("abcd0000-0000-4000-8000-000000000002")
    )
    assert (
        len(
            credential_leases.credential_leases_revoke(
                tenant=acme.tenant, prefix="ABCD", revoked_by="alice", reason="r"
            )
        )
        == 2
    )


@pytest.mark.parametrize("prefix", ["", "abc", "ab-c", "zzzz", "abcd-", "1234567-8", "x" * 40, "a" * 33])
def test_a_prefix_shorter_than_four_hex_digits_or_not_a_lease_id_start_is_refused(acme, bot, prefix):
    run, token = leased_run(acme.worker)
    issue(acme, run, token)
    with pytest.raises(InvalidInput, match="prefix"):
        len(
            credential_leases.credential_leases_revoke(
                tenant=acme.tenant, prefix=prefix, revoked_by="alice", reason="r"
            )
        )
    assert not CredentialLease.objects.filter(revoked_at__isnull=False).exists()


def test_revoke_by_prefix_stays_in_the_tenant(acme, bot, outsider):
    run, token = leased_run(acme.worker)
    lease = issue(acme, run, token)
    assert (
        len(
            credential_leases.credential_leases_revoke(
                tenant=outsider.tenant, prefix=str(lease.pk)[:8], revoked_by="m", reason="r"
            )
        )
        == 0
    )
    lease.refresh_from_db()
    assert lease.revoked_at is None


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"reason": ""}, InvalidInput),
        ({"revoked_by": " "}, InvalidInput),
        ({"reason": "password=" + "hunter22"}, ForbiddenField),
    ],
)
def test_revocation_names_a_user_and_a_clean_reason(acme, bot, kwargs, error):
    run, token = leased_run(acme.worker)
    lease = issue(acme, run, token)
    args = {"tenant": acme.tenant, "revoked_by": "alice", "reason": "r", **kwargs}
    with pytest.raises(error):
        credential_leases.credential_lease_revoke(lease_id=lease.pk, **args)
    with pytest.raises(error):
        len(credential_leases.credential_leases_revoke(principal="github-bot", **args))
    lease.refresh_from_db()
    assert lease.revoked_at is None


def test_matching_needs_a_principal_or_a_prefix(acme):
    with pytest.raises(InvalidInput):
        admin_selectors.credential_leases_matching(tenant=acme.tenant)


# --- under real concurrency ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_lease_issued_during_a_rotation_is_new_or_its_run_hears_of_the_rotation(acme, bot):
    runs = [leased_run(acme.worker, owner=f"o{i}") for i in range(8)]

    def act(i):
        if i == len(runs):
            return credentials.credential_rotate(
                tenant=acme.tenant, principal="github-bot", rotated_by="alice", reason="leak"
            )
        run, token = runs[i]
        return issue(acme, run, token)

    results = run_concurrently(act, len(runs) + 1)
    assert not [r for r in results if isinstance(r, BaseException)], results

    for lease in CredentialLease.objects.all():
        if lease.version == 2:
            continue
        issued = Event.objects.get(run_id=lease.run_id, type="CREDENTIAL_LEASE_ISSUED", fields__lease_id=str(lease.pk))
        rotated = Event.objects.get(run_id=lease.run_id, type="CREDENTIAL_ROTATED")
        assert rotated.seq > issued.seq and rotated.fields["version"] == 2
    for run, _ in runs:
        assert_chain_intact(run.pk)


@pytest.mark.django_db(transaction=True)
def test_concurrent_revocations_of_one_lease_leave_one_event(acme, bot):
    run, token = leased_run(acme.worker)
    lease = issue(acme, run, token)

    def revoke(i):
        if i % 2:
            return credential_leases.credential_lease_revoke(
                tenant=acme.tenant, lease_id=lease.pk, revoked_by=f"u{i}", reason="r"
            )
        return len(
            credential_leases.credential_leases_revoke(
                tenant=acme.tenant, principal="github-bot", revoked_by=f"u{i}", reason="r"
            )
        )

    results = run_concurrently(revoke, 8)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len(events_of(run, "CREDENTIAL_LEASE_REVOKED")) == 1
    assert_chain_intact(run.pk)


# --- management commands ------------------------------------------------------------------


def test_create_credential_command_prints_the_reference(acme, capsys):
    call_command("create_credential", "--tenant", "acme", "--principal", "github-bot", "--secret-ref", SECRET_REF)
    assert "created credential github-bot version 1" in capsys.readouterr().out
    assert Credential.objects.get(tenant=acme.tenant).secret_ref == SECRET_REF


def test_create_credential_command_refuses_a_secret_in_one_line_without_echoing_it(acme):
    with pytest.raises(CommandError) as refused:
        call_command("create_credential", "--tenant", "acme", "--principal", "github-bot", "--secret-ref", GITHUB_PAT)
    assert "\n" not in str(refused.value) and GITHUB_PAT not in str(refused.value)
    assert not Credential.objects.exists()


def test_commands_refuse_an_unknown_tenant(db):
    with pytest.raises(CommandError, match="no tenant"):
        call_command("create_credential", "--tenant", "nope", "--principal", "p", "--secret-ref", SECRET_REF)
    with pytest.raises(CommandError, match="no tenant"):
        call_command("rotate_credential", "--tenant", "nope", "--principal", "p", "--by", "a", "--reason", "r")


def test_rotate_credential_command(acme, bot, capsys):
    run, token = leased_run(acme.worker)
    issue(acme, run, token)
    call_command(
        "rotate_credential", "--tenant", "acme", "--principal", "github-bot", "--by", "alice", "--reason", "leak"
    )
    out = capsys.readouterr().out
    assert "to version 2" in out and "1 run(s)" in out and str(run.pk) in out
    with pytest.raises(CommandError, match="no credential"):
        call_command("rotate_credential", "--tenant", "acme", "--principal", "nobody", "--by", "alice", "--reason", "r")


def test_revoke_command_dry_run_prints_what_it_would_revoke_and_changes_nothing(acme, bot, capsys):
    run, token = leased_run(acme.worker)
    lease = issue(acme, run, token)
    base = ["revoke_credential_leases", "--tenant", "acme", "--by", "alice", "--reason", "r"]

    call_command(*base, "--principal", "github-bot", "--dry-run")
    out = capsys.readouterr().out
    assert str(lease.pk) in out and "would revoke 1 lease(s)" in out
    assert CredentialLease.objects.get().revoked_at is None
    assert events_of(run, "CREDENTIAL_LEASE_REVOKED") == []

    call_command(*base, "--prefix", str(lease.pk)[:8])
    out = capsys.readouterr().out
    assert str(lease.pk) in out and "revoked 1 lease(s)" in out
    assert CredentialLease.objects.get().revoked_by == "alice"

    call_command(*base, "--lease", str(lease.pk))
    assert "revoked 0 lease(s)" in capsys.readouterr().out
    assert len(events_of(run, "CREDENTIAL_LEASE_REVOKED")) == 1


def test_revoke_command_by_lease_id(acme, bot, capsys):
    run, token = leased_run(acme.worker)
    lease = issue(acme, run, token)
    base = ["revoke_credential_leases", "--tenant", "acme", "--by", "alice", "--reason", "r"]
    call_command(*base, "--lease", str(lease.pk), "--dry-run")
    assert "would revoke 1 lease(s)" in capsys.readouterr().out
    call_command(*base, "--lease", str(lease.pk))
    assert "revoked 1 lease(s)" in capsys.readouterr().out
    assert CredentialLease.objects.get().revoked_at is not None


def test_revoke_command_refuses_a_short_prefix_and_needs_exactly_one_selector(acme, bot):
    base = ["revoke_credential_leases", "--tenant", "acme", "--by", "alice", "--reason", "r"]
    with pytest.raises(CommandError, match="at least 4 hex digits"):
        call_command(*base, "--prefix", "ab")
    with pytest.raises(CommandError):
        call_command(*base)
    with pytest.raises(CommandError):
        call_command(*base, "--principal", "github-bot", "--prefix", "abcd")
