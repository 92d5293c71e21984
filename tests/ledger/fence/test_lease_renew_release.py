from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.errors import InvalidInput, LeaseLost, RunCompleted
from ledger.models import Event, LeaseGrant, Operation, Run, RunLease
from ledger.services.authority.policy import policy_change
from ledger.services.fence import leases, runs
from ledger.services.fence.notes import event_append
from ledger.services.lifespan.resources import Attach, resource_attach
from tests.factories import dispatched_operation, expire, leased_run


def test_renew_extends_the_lease_of_its_owner(acme):
    run, token = leased_run(acme.worker, ttl_s=5)
    before = Run.objects.select_related("lease").get(pk=run.pk).lease.expires_at
    lease = leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=60)
    assert lease.expires_at > before
    assert Event.objects.filter(run=run, type="LEASE_RENEWED").count() == 1


@pytest.mark.parametrize(
    "owner, token_delta, expire_first, reason",
    [
        ("someone-else", 0, False, "owner_changed"),
        ("owner-a", 1, False, "token_changed"),
        ("owner-a", 0, True, "expired"),
    ],
)
def test_renew_refusals_say_why_and_are_counted(acme, owner, token_delta, expire_first, reason):
    run, token = leased_run(acme.worker)
    if expire_first:
        expire(run)
    with pytest.raises(LeaseLost) as refused:
        leases.lease_renew(
            worker=acme.worker, run_id=run.pk, owner_id=owner, fencing_token=token + token_delta, ttl_s=30
        )
    assert refused.value.reason == reason
    run.refresh_from_db()
    assert run.stale_rejections == 1
    event = Event.objects.get(run=run, type="STALE_TOKEN_REJECTED")
    assert (event.fields["attempted"], event.fields["reason"]) == ("lease.renew", reason)


def test_an_expired_lease_cannot_be_renewed_back_to_life(acme):
    run, token = leased_run(acme.worker)
    expire(run)
    with pytest.raises(LeaseLost):
        leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=30)
    assert (
        Run.objects.select_related("lease").get(pk=run.pk).lease.expires_at
        < Event.objects.filter(run=run).last().occurred_at
    )


def test_release_frees_the_lease_and_makes_in_flight_effects_unknown(acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "k-1")
    leases.lease_release(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token)

    lease = Run.objects.select_related("lease").get(pk=run.pk).lease
    assert lease.owner_id is None and lease.fencing_token == token
    assert LeaseGrant.objects.get(run=run).end_reason == "RELEASED"
    assert Operation.objects.get(pk=op.pk).phase == "UNKNOWN"
    assert ReconciliationCase.objects.get(operation=op).reason == "LEASE_RELEASED"
    with pytest.raises(LeaseLost) as refused:
        leases.lease_release(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token)
    assert refused.value.reason == "released"


@pytest.mark.parametrize(("holds_open", "instance_state"), [(False, "RELEASED"), (True, "REAPING")])
def test_a_release_closes_and_moves_its_instance_in_one_update_of_the_grant(acme, holds_open, instance_state):
    run, token = leased_run(acme.worker)
    if holds_open:
        attach = Attach(kind="connection", provider="sandbox", handle="still-open")
        resource_attach(worker=acme.worker, run_id=run.pk, fencing_token=token, attach=attach)
    with CaptureQueriesContext(connection) as queries:
        leases.lease_release(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token)

    grant = LeaseGrant.objects.get(run=run)
    assert (grant.state, grant.end_reason) == (instance_state, "RELEASED")
    assert grant.ended_at == grant.state_changed_at
    grant_updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "ledger_leasegrant"')]
    assert len(grant_updates) == 1, grant_updates
    assert Event.objects.get(run=run, type="LEASE_RELEASED").fields["instance_state"] == instance_state


@pytest.mark.parametrize("ttl_s", [0, 3601, -1])
def test_ttl_outside_1_to_3600_is_refused_by_the_service_too(acme, ttl_s):
    run, token = leased_run(acme.worker)
    with pytest.raises(InvalidInput):
        leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=ttl_s)


def test_a_child_cannot_renew_after_its_parent_completed(acme):
    parent, parent_token = leased_run(acme.worker, owner="parent-owner")
    child, _ = runs.run_create(worker=acme.worker, schema_version=1, parent_run_id=parent.pk)
    child_token = leases.lease_acquire(
        worker=acme.worker, run_id=child.pk, owner_id="child-owner", ttl_s=30
    ).fencing_token
    leases.lease_renew(worker=acme.worker, run_id=child.pk, owner_id="child-owner", fencing_token=child_token, ttl_s=30)

    runs.run_complete(worker=acme.worker, run_id=parent.pk, fencing_token=parent_token)
    before = RunLease.objects.get(run=child).expires_at
    renewals = Event.objects.filter(run=child, type="LEASE_RENEWED").count()
    with pytest.raises(RunCompleted, match="parent run is completed"):
        leases.lease_renew(
            worker=acme.worker, run_id=child.pk, owner_id="child-owner", fencing_token=child_token, ttl_s=30
        )
    assert RunLease.objects.get(run=child).expires_at == before  # not extended
    assert Event.objects.filter(run=child, type="LEASE_RENEWED").count() == renewals


# --- the idle limit (issue 12, item 2) -------------------------------------------------------


def idle_for(run, seconds: int) -> None:
    """The test's clock: the run's last progress and its lease's start move into the past."""
    past = timezone.now() - timedelta(seconds=seconds)
    Run.objects.filter(pk=run.pk).update(last_progress_at=past)
    RunLease.objects.filter(run=run).update(acquired_at=past)


def test_a_renewal_after_the_idle_limit_ends_the_lease_as_an_expiry(acme):
    run, token = leased_run(acme.worker, ttl_s=3600)
    op = dispatched_operation(acme.worker, run, token, "idle-1")
    idle_for(run, 901)  # the starter policy's idle_limit_s is 900
    with pytest.raises(LeaseLost) as lost:
        leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=30)
    assert lost.value.reason == "idle"
    lease = RunLease.objects.get(run=run)
    assert (lease.owner_id, lease.end_reason) == (None, "EXPIRED")  # the end is committed
    assert Operation.objects.get(pk=op.pk).phase == "UNKNOWN"
    assert ReconciliationCase.objects.filter(operation=op).exists()
    ended = Event.objects.filter(run=run, type="LEASE_EXPIRED").get()
    assert ended.fields["reason"] == "idle"
    assert not Event.objects.filter(run=run, type="LEASE_RENEWED").exists()


def test_progress_keeps_the_lease_renewable_and_renewals_are_not_progress(acme):
    run, token = leased_run(acme.worker, ttl_s=3600)
    idle_for(run, 1200)
    before = timezone.now()
    event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"step": 2})
    progressed = Run.objects.get(pk=run.pk).last_progress_at
    assert progressed >= before  # the note is progress
    leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=30)
    assert Run.objects.get(pk=run.pk).last_progress_at == progressed  # a renewal alone is not progress


def test_no_idle_limit_when_the_policy_sets_none(acme):
    policy_change(tenant=acme.tenant, document={"idle_limit_s": None}, changed_by="t", reason="batch jobs")
    run, token = leased_run(acme.worker, ttl_s=3600)
    idle_for(run, 86400)
    leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=30)
    assert RunLease.objects.get(run=run).owner_id == "owner-a"
