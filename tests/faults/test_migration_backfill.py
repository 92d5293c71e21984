"""Schema migration, the backfill (issue 18): paused after 10 % and resumed it finishes with
nothing done twice (injection 2); a pause asked from elsewhere stops it after its batch; two
cannot run at once; run twice it is run once (injection 5); UNKNOWN operations are untouched;
racing live writers in other processes it leaves no record disagreeing."""

import pytest
from django.db import connection, connections

from approvals.models import ReconciliationCase
from ledger.errors import UpgradeRefused
from ledger.models import Event, Operation, StateConflict, Worker
from ledger.services.fence import outcomes
from ledger.services.upgrades.backfill import backfill_pause, backfill_run
from ledger.states import BackfillState, Outcome, Phase, UpgradePhase
from tests.factories import dispatched_operation, leased_run
from tests.faults.schema_change import CHANGE, all_agree, move, old_build_writes, version_one_operations
from tests.helpers import SPAWN, spawned

pytestmark = pytest.mark.django_db(transaction=True)


def counting_touches() -> None:
    """A trigger that records every write to an operation's version or provider_ref."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS test_touch (id uuid NOT NULL)")
        cursor.execute(
            "CREATE OR REPLACE FUNCTION test_touched() RETURNS trigger AS $$ BEGIN "
            "INSERT INTO test_touch VALUES (NEW.id); RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE OR REPLACE TRIGGER test_touch_operation AFTER UPDATE ON ledger_operation FOR EACH ROW "
            "WHEN (OLD.schema_version IS DISTINCT FROM NEW.schema_version "
            "OR OLD.provider_ref IS DISTINCT FROM NEW.provider_ref) EXECUTE FUNCTION test_touched()"
        )


def touches() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id::text, count(*) FROM test_touch GROUP BY id")
        return dict(cursor.fetchall())


@pytest.fixture
def touch_counter():
    counting_touches()
    yield touches
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS test_touch_operation ON ledger_operation")
        cursor.execute("DROP TABLE IF EXISTS test_touch")


# --- 2. pause the backfill after 10 %, resume -------------------------------------------


def test_pause_the_backfill_after_ten_percent_and_resume_it_finishes_with_nothing_done_twice(acme, touch_counter):
    ops = version_one_operations(acme, 120)
    move(UpgradePhase.MIGRATE)

    paused = backfill_run(CHANGE, batch_size=6, stop_after=0.1)
    assert paused.state == BackfillState.PAUSED
    moved_first = Operation.objects.filter(schema_version=2).count()
    assert 12 <= moved_first < 120  # a tenth (in whole batches), not all
    assert paused.changed == moved_first

    resumed = backfill_run(CHANGE, batch_size=6)
    assert resumed.state == BackfillState.DONE
    assert Operation.objects.filter(schema_version=1).count() == 0
    assert resumed.changed == 120  # the counts continue from where it paused
    seen = touch_counter()
    assert set(seen) == {str(op.pk) for op in ops}
    assert max(seen.values()) == 1, "an operation was written twice"
    for i, op in enumerate(ops):
        op.refresh_from_db()
        expected = {"provider": op.provider, "id": f"prov-{i}"} if i % 3 == 0 else None
        assert op.provider_ref == expected
    assert all_agree()


def test_a_backfill_asked_to_pause_from_elsewhere_stops_after_its_batch(acme):
    version_one_operations(acme, 30)
    move(UpgradePhase.MIGRATE)
    asked = []

    def report(progress):
        if not asked:
            asked.append(backfill_pause(CHANGE).state)  # another process's `backfill --pause`

    stopped = backfill_run(CHANGE, batch_size=5, report=report)
    assert asked == [BackfillState.PAUSING]
    assert stopped.state == BackfillState.PAUSED and stopped.changed == 5
    assert backfill_run(CHANGE, batch_size=5).state == BackfillState.DONE


def test_two_backfills_cannot_run_at_once(acme):
    version_one_operations(acme, 10)
    move(UpgradePhase.MIGRATE)
    from datetime import timedelta

    from django.utils import timezone

    from ledger.models import Backfill

    Backfill.objects.update_or_create(
        name=CHANGE,
        defaults={
            "state": BackfillState.RUNNING,
            "holder": "other-host:999",
            "held_until": timezone.now() + timedelta(seconds=60),
        },
    )
    with pytest.raises(UpgradeRefused, match="other-host:999"):
        backfill_run(CHANGE)
    assert Operation.objects.filter(schema_version=2).count() == 0


# --- 5. run the migration twice ----------------------------------------------------------


def test_running_the_migration_twice_is_running_it_once(acme, touch_counter):
    version_one_operations(acme, 25)
    move(UpgradePhase.MIGRATE)
    first = backfill_run(CHANGE, batch_size=7)
    after_first = {op.pk: (op.schema_version, op.provider_ref) for op in Operation.objects.all()}
    touched_first = touch_counter()
    again = backfill_run(CHANGE, batch_size=7, restart=True)  # the whole table walked again
    assert (first.changed, again.changed) == (25, 0)
    assert again.scanned == 25
    assert {op.pk: (op.schema_version, op.provider_ref) for op in Operation.objects.all()} == after_first
    assert touch_counter() == touched_first  # not one write the second time
    # The schema migration's own data step, run again, changes nothing either.
    import importlib

    from django.apps import apps

    step = importlib.import_module("ledger.migrations.0022_upgrades_expand").change_starts_expanded
    step(apps, None)
    from ledger.models import SchemaChange

    assert list(SchemaChange.objects.values_list("name", "phase")) == [(CHANGE, UpgradePhase.MIGRATE)]
    with pytest.raises(UpgradeRefused, match="already in MIGRATE"):
        move(UpgradePhase.MIGRATE)


# --- UNKNOWN stays UNKNOWN ---------------------------------------------------------------


def test_unknown_operations_are_untouched_by_the_backfill(acme):
    run, token = leased_run(acme.worker, ttl_s=600)
    unknown = []
    for i in range(6):
        op = dispatched_operation(acme.worker, run, token, f"u-{i}")
        outcomes.operation_report_outcome(
            worker=acme.worker,
            operation_id=op.pk,
            fencing_token=token,
            outcome=Outcome.UNKNOWN,
            provider_request_id=f"maybe-{i}" if i % 2 else "",
        )
        old_build_writes(op, f"maybe-{i}" if i % 2 else "")
        Operation.objects.filter(pk=op.pk).update(provider_ref=None)
        unknown.append(op.pk)
    kept = ("phase", "attempt", "fencing_token", "provider_request_id", "reconciliation", "actual_cost_cents")
    before = {o["id"]: o for o in Operation.objects.filter(pk__in=unknown).values("id", *kept)}
    cases_before = dict(
        ReconciliationCase.objects.filter(operation_id__in=unknown).values_list("operation_id", "status")
    )
    events_before = Event.objects.filter(run=run).count()
    move(UpgradePhase.MIGRATE)
    assert backfill_run(CHANGE, batch_size=2).state == BackfillState.DONE
    after = {o["id"]: o for o in Operation.objects.filter(pk__in=unknown).values("id", *kept)}
    assert after == before
    assert {o.phase for o in Operation.objects.filter(pk__in=unknown)} == {Phase.UNKNOWN}
    assert (
        dict(ReconciliationCase.objects.filter(operation_id__in=unknown).values_list("operation_id", "status"))
        == cases_before
    )
    assert Event.objects.filter(run=run).count() == events_before  # the backfill writes no event
    assert set(Operation.objects.filter(pk__in=unknown).values_list("schema_version", flat=True)) == {2}


# --- a backfill racing live writers -------------------------------------------------------


def _report_many(worker_id, pairs, barrier):
    try:
        worker = Worker.objects.get(pk=worker_id)
        barrier.wait(120)
        for op_id, token in pairs:
            outcomes.operation_report_outcome(
                worker=worker,
                operation_id=op_id,
                fencing_token=token,
                outcome=Outcome.CONFIRMED,
                provider_request_id=f"r-{op_id[:8]}",
            )
    finally:
        connections.close_all()


def _backfill(barrier):
    try:
        barrier.wait(120)
        backfill_run(CHANGE, batch_size=3)
    finally:
        connections.close_all()


def test_a_backfill_racing_live_writers_leaves_no_record_disagreeing(acme):
    version_one_operations(acme, 30)
    runs = [leased_run(acme.worker, owner=f"w-{i}", ttl_s=600) for i in range(2)]
    live = [
        [(str(dispatched_operation(acme.worker, run, token, f"live-{n}-{i}").pk), token) for i in range(12)]
        for n, (run, token) in enumerate(runs)
    ]
    # The writers are mid-expand: their operations are at version 1 when the migration starts.
    Operation.objects.filter(idempotency_key__startswith="live-").update(schema_version=1)
    move(UpgradePhase.MIGRATE)
    barrier = SPAWN.Barrier(3)
    racers = [
        spawned("tests.faults.test_migration_backfill", "_report_many", acme.worker.pk, pairs, barrier)
        for pairs in live
    ]
    racers.append(spawned("tests.faults.test_migration_backfill", "_backfill", barrier))
    for racer in racers:
        racer.join(240)
        assert racer.exitcode == 0
    assert all_agree()
    assert not StateConflict.objects.exists()
    assert backfill_run(CHANGE, restart=True).state == BackfillState.DONE
    assert Operation.objects.filter(schema_version=1).count() == 0
    assert set(Operation.objects.filter(idempotency_key__startswith="live-").values_list("phase", flat=True)) == {
        Phase.CONFIRMED
    }
