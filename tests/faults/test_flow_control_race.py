"""Flow control at dispatch under a 16-process race (issue 39, item 4): real processes, each
with its own connection, dispatching real operations against real PostgreSQL.

(a) A concurrency limit of N: at no instant more than N DISPATCHED under the key, and each
    round admits exactly N (the places are all free at its start and nobody gives one back
    during it).
(b) A rate limit of burst B and per_s R in n shards: the admitted dispatches are exactly the
    tokens the shards gave (``taken``), and with E what refills added (``earned``, by the
    database's clock), B + E - n < admitted <= B + E <= B + R * t, t the time from the
    bucket's opening to its last refill. The gap R * t - E is refill lost while a shard sat
    full; n is the shards' rounding (fewer than one token left in each when it refuses).
"""

import pytest
from django.db import connections

from ledger.errors import Throttled
from ledger.models import FlowBucket, FlowSlot, Operation
from ledger.services.core.intent import Intent
from ledger.services.fence import operations
from tests.factories import leased_run, set_policy
from tests.helpers import SPAWN, spawned

pytestmark = pytest.mark.django_db(transaction=True)

PROCESSES = 16
PLACES = 5
ROUNDS = 3
CHURN = 3
BURST, PER_S, SHARDS = 24, 2, 4
PER_RACER = 4


def authorized_ops(acme, run, token, prefix, count) -> list[str]:
    ids = []
    for i in range(count):
        op, _ = operations.operation_intend(
            worker=acme.worker,
            run_id=run.pk,
            fencing_token=token,
            intent=Intent(
                tool="email",
                action="send",
                resource="mailto:x@example.com",
                effect_class="IDEMPOTENT",
                idempotency_key=f"{prefix}-{i}",
            ),
        )
        operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
        ids.append(str(op.pk))
    return ids


def racers_with_ops(acme, count):
    """Per racer: (its run's token, its AUTHORIZED operations)."""
    prepared = []
    for r in range(PROCESSES):
        run, token = leased_run(acme.worker, owner=f"racer-{r}", ttl_s=600)
        prepared.append((token, authorized_ops(acme, run, token, f"r{r}", count)))
    return prepared


def in_flight(tenant) -> tuple[int, int]:
    """(operations DISPATCHED, places held) of the tenant's key now."""
    dispatched = Operation.objects.filter(tenant=tenant, phase="DISPATCHED").count()
    return dispatched, FlowSlot.objects.filter(tenant=tenant, key="tenant", operation__isnull=False).count()


def test_sixteen_processes_never_have_more_than_n_in_flight_and_each_round_admits_exactly_n(acme):
    set_policy(acme.tenant, concurrency={"tenant": PLACES})
    prepared = racers_with_ops(acme, ROUNDS + CHURN)
    connections.close_all()
    # go[ROUNDS]: the churn's
    go, counted = [SPAWN.Event() for _ in range(ROUNDS + 1)], [SPAWN.Event() for _ in range(ROUNDS)]
    results, ready, released = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Queue()
    racers = [
        spawned(
            "tests.faults.flow_racers", "concurrency_racer", acme.worker.pk, token, ops[:ROUNDS], ops[ROUNDS:],
            go, counted, results, ready, released,
        )
        for token, ops in prepared
    ]  # fmt: skip
    seen = []
    for k in range(ROUNDS):
        for _ in racers:  # every racer waits for the go
            ready.get(timeout=300)
        go[k].set()
        round_results = [results.get(timeout=300) for _ in racers]
        seen += round_results
        assert not [r for r in round_results if r[1].startswith("error")], round_results
        admitted = [r for r in round_results if r[1] == "admitted"]
        assert len(admitted) == PLACES, round_results
        assert {r[1] for r in round_results} == {"admitted", "throttled tenant"}
        assert in_flight(acme.tenant) == (PLACES, PLACES)  # nothing moves until counted[k]
        counted[k].set()
        assert sorted(released.get(timeout=300) for _ in admitted) == sorted(r[0] for r in admitted)
        assert in_flight(acme.tenant) == (0, 0)
    go[ROUNDS].set()
    seen += [results.get(timeout=300) for _ in range(PROCESSES * CHURN)]
    for racer in racers:
        racer.join(120)
        assert racer.exitcode == 0

    assert not [r for r in seen if r[1].startswith("error")], seen
    assert max(r[2] for r in seen) <= PLACES  # what each racer saw just after its dispatch
    assert in_flight(acme.tenant) == (0, 0)
    assert FlowSlot.objects.filter(tenant=acme.tenant).count() == PLACES
    churned = [r for r in seen[ROUNDS * PROCESSES :] if r[1] == "admitted"]
    assert churned  # the churn admitted some while others gave places back


def test_sixteen_processes_get_the_burst_and_the_refill_and_not_one_token_more(acme, settings, monkeypatch):
    monkeypatch.setenv("FENCELINE_FLOW_BUCKET_SHARDS", str(SHARDS))  # the racers' settings
    settings.FENCELINE = {**settings.FENCELINE, "FLOW_BUCKET_SHARDS": SHARDS}  # this process's
    set_policy(acme.tenant, rate_limits={"tenant": {"per_s": PER_S, "burst": BURST}})
    prepared = racers_with_ops(acme, PER_RACER)
    drain_run, drain_token = leased_run(acme.worker, owner="drainer", ttl_s=600)
    drain_ops = authorized_ops(acme, drain_run, drain_token, "drain", 40)
    connections.close_all()
    barrier = SPAWN.Barrier(PROCESSES)
    results = SPAWN.Queue()
    racers = [
        spawned("tests.faults.flow_racers", "rate_racer", acme.worker.pk, token, ops, barrier, results)
        for token, ops in prepared
    ]
    outcomes = [outcome for _ in racers for outcome in results.get(timeout=300)]
    for racer in racers:
        racer.join(120)
        assert racer.exitcode == 0
    assert not [o for o in outcomes if o[1].startswith("error")], outcomes
    admitted = sum(1 for o in outcomes if o[1] == "admitted")
    # Drain what is left, until the bucket refuses: every shard then had less than one token.
    for op_id in drain_ops:
        try:
            operations.operation_dispatch(worker=acme.worker, operation_id=op_id, fencing_token=drain_token)
            admitted += 1
        except Throttled:
            break
    else:
        pytest.fail("the bucket never refused")

    shards = list(FlowBucket.objects.filter(tenant=acme.tenant, key="tenant"))
    assert len(shards) == SHARDS
    assert admitted == sum(s.taken for s in shards) == Operation.objects.filter(phase="DISPATCHED").count()
    earned = sum(s.earned for s in shards)
    for s in shards:  # conservation per shard: what it gave is its capacity and refills, less what it holds
        assert s.taken == pytest.approx(BURST // SHARDS + s.earned - s.tokens, abs=1e-6)
        assert s.tokens < 1
    elapsed = (max(s.refilled_at for s in shards) - min(s.created_at for s in shards)).total_seconds()
    assert BURST + earned - SHARDS < admitted <= BURST + earned + 1e-6
    assert earned <= PER_S * elapsed + 1e-6
