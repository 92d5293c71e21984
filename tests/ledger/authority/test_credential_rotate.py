"""Rotating a credential: a new version, and each run holding an active lease of it hears
of the rotation in its chain, also when leases are issued while it rotates (real threads)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.errors import ForbiddenField, InvalidInput, NotFound
from ledger.models import CredentialLease, Event
from ledger.services.authority import credential_leases, credentials
from tests.factories import GITHUB_PAT, credential_lease, leased_run
from tests.helpers import assert_chain_intact, events_of, run_concurrently

# --- rotate -------------------------------------------------------------------------------


def test_rotate_bumps_the_version_and_tells_each_run_holding_an_active_lease(acme, bot):
    credentials.credential_create(tenant=acme.tenant, principal="slack-bot", secret_ref="vault:kv/slack-bot")
    holding, t1 = leased_run(acme.worker, owner="a")
    holding_twice, t2 = leased_run(acme.worker, owner="b")
    expired_only, t3 = leased_run(acme.worker, owner="c")
    revoked_only, t4 = leased_run(acme.worker, owner="d")
    other_principal, t5 = leased_run(acme.worker, owner="e")
    credential_lease(acme, holding, t1)
    credential_lease(acme, holding_twice, t2)
    credential_lease(acme, holding_twice, t2, actions=["comment"])
    old = credential_lease(acme, expired_only, t3)
    CredentialLease.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    gone = credential_lease(acme, revoked_only, t4)
    credential_leases.credential_lease_revoke(tenant=acme.tenant, lease_id=gone.pk, revoked_by="bob", reason="done")
    credential_lease(acme, other_principal, t5, principal="slack-bot")

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
    assert credential_lease(acme, holding, t1).version == 2


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
        return credential_lease(acme, run, token)

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
