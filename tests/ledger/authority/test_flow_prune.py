"""The retention job prunes the flow-control rows of idle intent-named keys
(``flow_keys_prune``, ledger/services/authority/flow.py): a ``key:<flow_key>`` whose places are
all free and untaken for FLOW_KEY_IDLE_S loses them, a key held or recently taken keeps them,
a bucket shard goes only once it would be full again; the key works again after; the named
keys of other kinds are never pruned; a second pass removes nothing more."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from ledger.models import FlowBucket, FlowSlot
from ledger.services.authority.flow import flow_keys_prune
from ledger.services.core.intent import Intent
from ledger.services.fence import operations
from ledger.tasks import retention_task
from tests.factories import confirm, leased_run, set_policy

pytestmark = pytest.mark.django_db

DAY = 86400


def dispatched(acme, run, token, key, flow_key, *, tool="email"):
    op, _ = operations.operation_intend(
        worker=acme.worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool=tool, action="send", resource="mailto:x@example.com", effect_class="IDEMPOTENT",
            idempotency_key=key, flow_key=flow_key,
        ),
    )  # fmt: skip
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    return operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)


def age(key: str, seconds: int) -> None:
    """The rows of ``key`` as if last taken ``seconds`` ago."""
    then = timezone.now() - timedelta(seconds=seconds)
    FlowSlot.objects.filter(key=key, taken_at__isnull=False).update(taken_at=then)
    FlowBucket.objects.filter(key=key).update(refilled_at=then)


def test_idle_intent_keys_lose_their_places_held_and_recent_ones_keep_them(acme):
    set_policy(acme.tenant, concurrency={"key:*": 2, "tool:email": 50})
    run, token = leased_run(acme.worker)
    confirm(acme.worker, dispatched(acme, run, token, "a", "cust-idle"), token)
    dispatched(acme, run, token, "b", "cust-held")  # still DISPATCHED
    confirm(acme.worker, dispatched(acme, run, token, "c", "cust-recent"), token)
    for key in ("key:cust-idle", "key:cust-held", "tool:email"):
        age(key, 2 * DAY)

    pruned = flow_keys_prune(now=timezone.now(), idle_s=DAY)

    assert pruned.places == 2  # both places of key:cust-idle
    keys = set(FlowSlot.objects.values_list("key", flat=True))
    assert keys == {"key:cust-held", "key:cust-recent", "tool:email"}
    assert flow_keys_prune(now=timezone.now(), idle_s=DAY).places == 0
    # The key works again, its places made afresh.
    assert dispatched(acme, run, token, "d", "cust-idle").phase == "DISPATCHED"
    assert FlowSlot.objects.filter(key="key:cust-idle", operation__isnull=False).count() == 1


def test_a_place_given_back_keeps_when_it_was_taken(acme):
    set_policy(acme.tenant, concurrency={"key:*": 1})
    run, token = leased_run(acme.worker)
    confirm(acme.worker, dispatched(acme, run, token, "a", "cust-1"), token)
    slot = FlowSlot.objects.get(key="key:cust-1")
    assert slot.operation_id is None and slot.taken_at is not None
    assert flow_keys_prune(now=timezone.now(), idle_s=DAY).places == 0  # taken just now: not idle


def test_a_bucket_shard_goes_only_once_it_would_be_full_again(acme, settings):
    settings.FENCELINE = {**settings.FENCELINE, "FLOW_BUCKET_SHARDS": 2}
    # burst 4 at 1 per hour: a shard is full again only (4 + 2) hours after its last token.
    set_policy(acme.tenant, rate_limits={"key:*": {"per_s": 1 / 3600, "burst": 4}, "tenant": {"per_s": 1, "burst": 9}})
    run, token = leased_run(acme.worker)
    confirm(acme.worker, dispatched(acme, run, token, "a", "cust-1"), token)
    age("key:cust-1", 2 * 3600)
    age("tenant", 30 * DAY)

    assert flow_keys_prune(now=timezone.now(), idle_s=3600).shards == 0  # idle, but not full yet

    age("key:cust-1", 7 * 3600)
    assert flow_keys_prune(now=timezone.now(), idle_s=3600).shards == 2
    assert set(FlowBucket.objects.values_list("key", flat=True)) == {"tenant"}  # never a named key's
    assert dispatched(acme, run, token, "b", "cust-1").phase == "DISPATCHED"


def test_the_retention_job_and_command_prune_idle_intent_keys(acme):
    set_policy(acme.tenant, concurrency={"key:*": 3})
    run, token = leased_run(acme.worker)
    confirm(acme.worker, dispatched(acme, run, token, "a", "cust-1"), token)
    confirm(acme.worker, dispatched(acme, run, token, "b", "cust-2"), token)
    age("key:cust-1", 2 * DAY)
    assert retention_task()["flow_places"] == 3
    age("key:cust-2", 2 * DAY)
    out = StringIO()
    call_command("retention", stdout=out)
    assert "pruned 3 places" in out.getvalue()
    assert not FlowSlot.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_pruning_while_dispatches_race_never_lets_a_key_hold_more_than_its_limit(acme):
    """Threads dispatch and confirm under one intent-named key of concurrency 1 while another
    prunes it as hard as it can (idle 0 s): at no moment are two of them in flight."""
    import threading
    import time

    from django.db import connections

    from ledger.errors import Throttled

    set_policy(acme.tenant, concurrency={"key:*": 1})
    in_flight, most, lock, done = [0], [0], threading.Lock(), threading.Event()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            run, token = leased_run(acme.worker, owner=f"owner-{n}")
            for i in range(4):
                op, _ = operations.operation_intend(
                    worker=acme.worker, run_id=run.pk, fencing_token=token,
                    intent=Intent(tool="email", action="send", resource="mailto:x@example.com",
                                  effect_class="IDEMPOTENT", idempotency_key=f"w{n}-{i}", flow_key="hot"),
                )  # fmt: skip
                operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
                while True:
                    try:
                        operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
                        break
                    except Throttled:
                        time.sleep(0.005)
                with lock:
                    in_flight[0] += 1
                    most[0] = max(most[0], in_flight[0])
                time.sleep(0.01)  # in flight a moment: the others' dispatches and the pruner go on
                with lock:  # counted out before the outcome that frees the place commits
                    in_flight[0] -= 1
                confirm(acme.worker, op, token)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def pruner() -> None:
        try:
            while not done.is_set():
                flow_keys_prune(now=timezone.now(), idle_s=0)
        finally:
            connections.close_all()

    prune = threading.Thread(target=pruner)
    prune.start()
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(5)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    done.set()
    prune.join()

    assert errors == []
    assert most[0] == 1
    assert FlowSlot.objects.filter(key="key:hot", operation__isnull=False).count() == 0
