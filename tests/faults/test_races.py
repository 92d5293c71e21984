"""Races with real concurrency: 16 threads, each its own HTTP connection to a threaded
live server and so its own PostgreSQL transaction."""

import time
from datetime import datetime, timedelta

from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.models import Event, LeaseGrant, Operation, Run, RunLease
from tests.factories import expire
from tests.helpers import assert_chain_intact, run_concurrently

THREADS = 16


def test_many_workers_taking_over_an_expired_lease_exactly_one_wins(api_for, acme):
    first = api_for(acme)
    run_id = first.create_run()
    assert first.acquire(run_id, "worker-a").body["fencing_token"] == 1
    op_id = first.intend(run_id, 1, "charge:1").body["operation_id"]
    first.authorize(op_id, 1)
    first.dispatch(op_id, 1)
    expire(run_id)

    clients = [api_for(acme) for _ in range(THREADS)]
    results = run_concurrently(lambda i: clients[i].acquire(run_id, f"contender-{i}"), THREADS)

    winners = [r for r in results if r.status == 200]
    losers = [r for r in results if r.status != 200]
    assert len(winners) == 1, results
    assert winners[0].body["fencing_token"] == 2
    assert {(r.status, r.body["error"]) for r in losers} == {(409, "LEASE_HELD")}

    lease = RunLease.objects.get(run_id=run_id)
    assert lease.fencing_token == 2
    assert list(LeaseGrant.objects.filter(run_id=run_id).values_list("fencing_token", flat=True)) == [1, 2]
    # The lost owner's in-flight effect became UNKNOWN once, with one case.
    assert Operation.objects.get(pk=op_id).phase == "UNKNOWN"
    assert ReconciliationCase.objects.filter(operation_id=op_id).count() == 1
    events = assert_chain_intact(run_id)
    assert [e.type for e in events].count("LEASE_EXPIRED") == 1


def test_many_posts_of_the_same_intent_make_one_operation(api_for, acme):
    owner = api_for(acme)
    run_id = owner.create_run()
    owner.acquire(run_id, "worker-a")
    clients = [api_for(acme) for _ in range(THREADS)]

    results = run_concurrently(lambda i: clients[i].intend(run_id, 1, "ticket:create:77"), THREADS)

    assert sorted(r.status for r in results) == [200] * (THREADS - 1) + [201], results
    assert len({r.body["operation_id"] for r in results}) == 1
    assert Operation.objects.filter(tenant=acme.tenant, idempotency_key="ticket:create:77").count() == 1
    events = assert_chain_intact(run_id)
    assert [e.type for e in events].count("OPERATION_PLANNED") == 1


def test_same_key_on_two_runs_at_once_makes_one_operation_and_one_mismatch(api_for, acme):
    owner = api_for(acme)
    runs = [owner.create_run(), owner.create_run()]
    for run_id in runs:
        owner.acquire(run_id, "worker-a")
    clients = [api_for(acme) for _ in range(THREADS)]

    results = run_concurrently(lambda i: clients[i].intend(runs[i % 2], 1, "shared-key"), THREADS)

    created = [r for r in results if r.status == 201]
    assert len(created) == 1
    winner_run = Operation.objects.get(tenant=acme.tenant, idempotency_key="shared-key").run_id
    for i, r in enumerate(results):
        if runs[i % 2] == str(winner_run):
            assert r.status in (200, 201), r
        else:
            assert (r.status, r.body["error"]) == (422, "IDEMPOTENCY_MISMATCH"), r
    for run_id in runs:
        assert_chain_intact(run_id)


def test_stale_and_current_tokens_writing_at_once_only_current_writes_land(api_for, acme):
    owner = api_for(acme)
    run_id = owner.create_run()
    owner.acquire(run_id, "worker-a")
    expire(run_id)
    assert owner.acquire(run_id, "worker-b").body["fencing_token"] == 2
    clients = [api_for(acme) for _ in range(THREADS)]

    def write(i: int):
        token = 1 if i % 2 else 2
        return token, clients[i].intend(run_id, token, f"write-{i}")

    results = run_concurrently(write, THREADS)

    for token, r in results:
        if token == 2:
            assert r.status == 201, r
        else:
            assert (r.status, r.body["error"]) == (409, "STALE_TOKEN"), r
    landed = set(Operation.objects.filter(run_id=run_id).values_list("idempotency_key", flat=True))
    assert landed == {f"write-{i}" for i in range(0, THREADS, 2)}
    assert Run.objects.get(pk=run_id).stale_rejections == THREADS // 2
    events = assert_chain_intact(run_id)
    assert [e.type for e in events].count("STALE_TOKEN_REJECTED") == THREADS // 2


def test_concurrent_dispatches_of_one_operation_dispatch_it_once(api_for, acme):
    owner = api_for(acme)
    run_id = owner.create_run()
    owner.acquire(run_id, "worker-a")
    op_id = owner.intend(run_id, 1, "deploy:1", effect_class="IDEMPOTENT").body["operation_id"]
    owner.authorize(op_id, 1)
    clients = [api_for(acme) for _ in range(THREADS)]

    results = run_concurrently(lambda i: clients[i].dispatch(op_id, 1), THREADS)

    assert sorted(r.status for r in results) == [200] + [409] * (THREADS - 1)
    assert {r.body.get("error") for r in results if r.status == 409} == {"WRONG_PHASE"}
    assert Event.objects.filter(run_id=run_id, type="OPERATION_DISPATCHED").count() == 1


def test_dispatch_racing_takeovers_at_the_expiry_instant_never_survives_under_a_dead_token(api_for, acme):
    """At the instant a lease expires, one thread dispatches under token 1 while fifteen try
    to take the lease over. Either the dispatch lands first, and the takeover then turns it
    UNKNOWN with a case, or it is refused; it never stays DISPATCHED under token 1."""
    outcomes = set()
    for attempt in range(4):
        owner = api_for(acme)
        run_id = owner.create_run()
        granted = owner.acquire(run_id, "worker-a", ttl_s=4)  # room for the setup on a loaded machine
        op_id = owner.intend(run_id, 1, f"race:{attempt}").body["operation_id"]
        owner.authorize(op_id, 1)
        expires_at = datetime.fromisoformat(granted.body["expires_at"].replace("Z", "+00:00"))
        clients = [api_for(acme) for _ in range(THREADS)]

        def act(i: int, expires_at=expires_at, attempt=attempt, clients=clients, op_id=op_id, run_id=run_id):
            # Stagger around the expiry instant: -20 ms .. +10 ms.
            target = expires_at + timedelta(milliseconds=(attempt - 2) * 10)
            delay = (target - timezone.now()).total_seconds()
            if delay > 0:
                time.sleep(delay)
            if i == 0:
                return clients[i].dispatch(op_id, 1)
            return clients[i].acquire(run_id, f"rescuer-{i}")

        results = run_concurrently(act, THREADS)

        op = Operation.objects.get(pk=op_id)
        dispatched = results[0]
        if dispatched.status == 200:
            outcomes.add("dispatched-then-fenced")
            assert op.phase in ("DISPATCHED", "UNKNOWN")
            if any(r.status == 200 for r in results[1:]):
                assert op.phase == "UNKNOWN"
                assert ReconciliationCase.objects.filter(operation=op).count() == 1
        else:
            outcomes.add("refused")
            assert dispatched.body["error"] == "STALE_TOKEN", dispatched
            assert op.phase == "AUTHORIZED"
        assert sum(r.status == 200 for r in results[1:]) <= 1
        assert_chain_intact(run_id)
    assert outcomes, "no attempt ran"
