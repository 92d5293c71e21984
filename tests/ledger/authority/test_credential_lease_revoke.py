"""Revoking credential leases: one, by principal or by id prefix (with a preview that changes
nothing), each decision naming a user and a reason in the affected runs' chains, once only,
also when revocations race (real threads), and never in another tenant."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger import admin_selectors
from ledger.errors import ForbiddenField, InvalidInput, NotFound
from ledger.models import CredentialLease
from ledger.services.authority import credential_leases, credentials
from tests.factories import credential_lease, leased_run
from tests.helpers import assert_chain_intact, events_of, run_concurrently

# --- revoke -------------------------------------------------------------------------------


def test_revoke_one_records_user_and_reason_in_the_leases_run(acme, bot):
    run, token = leased_run(acme.worker)
    lease = credential_lease(acme, run, token)

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
    lease = credential_lease(acme, run, token)
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
    lease = credential_lease(acme, run, token)
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
    lease = credential_lease(acme, run, token)
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
    a1, a2 = credential_lease(acme, run_a, ta), credential_lease(acme, run_a, ta, actions=["comment"])
    b1 = credential_lease(acme, run_b, tb)
    expired = credential_lease(acme, run_b, tb, actions=["comment"])
    CredentialLease.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    other = credential_lease(acme, run_b, tb, principal="slack-bot")

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
    leases = [credential_lease(acme, run, token, actions=[f"a{i}"]) for i in range(3)]
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
    credential_lease(acme, run, token)
    CredentialLease.objects.update(id=uuid.UUID("abcd0000-0000-4000-8000-000000000001"))
    credential_lease(acme, run, token)
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
    credential_lease(acme, run, token)
    with pytest.raises(InvalidInput, match="prefix"):
        len(
            credential_leases.credential_leases_revoke(
                tenant=acme.tenant, prefix=prefix, revoked_by="alice", reason="r"
            )
        )
    assert not CredentialLease.objects.filter(revoked_at__isnull=False).exists()


def test_revoke_by_prefix_stays_in_the_tenant(acme, bot, outsider):
    run, token = leased_run(acme.worker)
    lease = credential_lease(acme, run, token)
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
    lease = credential_lease(acme, run, token)
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


@pytest.mark.django_db(transaction=True)
def test_concurrent_revocations_of_one_lease_leave_one_event(acme, bot):
    run, token = leased_run(acme.worker)
    lease = credential_lease(acme, run, token)

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
