"""ledger/sql: each statement's shape on PostgreSQL — what it locks (probed from a second
connection with NOWAIT), what it returns, and that the hot ones are prepared from their
second use on a connection."""

import hashlib
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import (
    CapabilityBudget,
    CostReservation,
    CostWindow,
    Credential,
    Event,
    FenceGeneration,
    LeaseGrant,
    Operation,
    Run,
    RunLease,
    Tenant,
)
from ledger.services.authority.credentials import credential_create
from ledger.services.authority.policy import policy_current
from ledger.services.authority.windows import budgets_for, run_shard_hash, window_bounds, windows_ensure
from ledger.services.evidence.append import HEAD_FIELDS, build_event
from ledger.sql import chain, costs, credentials, evidence, fence, lifespan, reads, rows, upgrades
from ledger.sql.connection import numbered
from ledger.states import ReservationState
from tests.factories import expire, intended_operation, leased_run, planned_op, set_cost_policy

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def second_connection():
    """Another session on the test database, autocommitting, to probe locks from."""
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"] or None, port=db["PORT"] or None, user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as other:
        yield other


def locked(other: psycopg.Connection, table: str, where: str, value: object) -> bool:
    """Whether the rows of ``table`` matching ``where`` are locked against FOR UPDATE."""
    try:
        other.execute(f"SELECT 1 FROM {table} WHERE {where} = %s FOR UPDATE NOWAIT", [value])  # noqa: S608
    except psycopg.errors.LockNotAvailable:
        return True
    return False


def share_locked(other: psycopg.Connection, table: str, value: object) -> bool:
    """Whether the row is locked against FOR SHARE (a FOR UPDATE lock)."""
    try:
        other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR SHARE NOWAIT", [value])  # noqa: S608
    except psycopg.errors.LockNotAvailable:
        return True
    return False


def prepared_statements(text: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = %s", [text])
        return int(cursor.fetchone()[0])


def test_placeholders_are_numbered_once_and_a_double_percent_is_a_percent():
    assert numbered("SELECT %s, %s WHERE x LIKE 'a%%'") == "SELECT $1, $2 WHERE x LIKE 'a%'"
    assert numbered("SELECT 1") == "SELECT 1"


def test_lock_run_locks_the_lease_and_the_run_not_the_tenant(acme, outsider):
    run, _ = leased_run(acme.worker)
    with transaction.atomic():
        row = fence.lock_run(run_id=run.pk, tenant_id=acme.tenant.pk)
        assert len(row) == len(fence.LEASE) + len(fence.RUN) + len(fence.TENANT)
        assert row[len(fence.LEASE) + fence.RUN.index("id")] == run.pk
        with second_connection() as other:
            assert locked(other, "ledger_runlease", "run_id", run.pk)
            assert locked(other, "ledger_run", "id", run.pk)
            assert not locked(other, "ledger_tenant", "id", acme.tenant.pk)
    assert fence.lock_run(run_id=run.pk, tenant_id=outsider.tenant.pk) is None


def test_the_fence_generation_is_read_key_shared_a_restore_waits_and_acquisitions_do_not(acme):
    FenceGeneration.objects.all().delete()
    with transaction.atomic():
        assert fence.fence_generation_shared() == 0  # a database without the row is at generation 0
    FenceGeneration.objects.create(pk=1, generation=42)
    with transaction.atomic():
        assert fence.fence_generation_shared() == 42
        with second_connection() as other:
            assert locked(other, "ledger_fencegeneration", "id", 1)  # a restore's FOR UPDATE waits
            assert not share_locked(other, "ledger_fencegeneration", 1)
            other.execute("SELECT 1 FROM ledger_fencegeneration WHERE id = 1 FOR KEY SHARE NOWAIT")  # another acquire


def test_lock_operation_reads_the_operation_and_capabilities_without_locking_them(acme, outsider):
    run, token = leased_run(acme.worker)
    op = intended_operation(acme.worker, run, token, "k-lock")
    run.refresh_from_db()
    with transaction.atomic():
        row = fence.lock_operation(operation_id=op.pk, tenant_id=acme.tenant.pk, denied="DENIED")
        head = len(fence.LEASE) + len(fence.RUN) + len(fence.TENANT)
        parts = 1 + len(fence.OPERATION) + len(fence.CREDENTIAL_LEASE) + 1 + len(fence.RESERVATION)
        assert len(row) == head + parts + len(fence.CAPABILITY)
        assert row[head] == run.last_seq  # the run's last seq as the statement's snapshot saw it
        assert row[head + 1 + fence.OPERATION.index("id")] == op.pk
        assert row[-1] is None  # no capability for the tool: the arrays are NULL
        with second_connection() as other:
            assert locked(other, "ledger_run", "id", run.pk)
            assert not locked(other, "ledger_operation", "id", op.pk)
    plain = fence.lock_operation(operation_id=op.pk, tenant_id=acme.tenant.pk)
    assert len(plain) == head + parts
    assert fence.lock_operation(operation_id=op.pk, tenant_id=outsider.tenant.pk) is None


def test_the_fence_statements_are_prepared_from_their_second_use(acme):
    run, _ = leased_run(acme.worker)
    connection.close()  # a new connection: nothing prepared on it yet
    with transaction.atomic():
        fence.lock_run(run_id=run.pk, tenant_id=acme.tenant.pk)
        text = numbered(fence._lock_sql(False))
        assert prepared_statements(text) == 0
        fence.lock_run(run_id=run.pk, tenant_id=acme.tenant.pk)
        fence.lock_run(run_id=run.pk, tenant_id=acme.tenant.pk)
        assert prepared_statements(text) == 1


def test_runs_expired_locks_both_rows_and_skips_a_run_busy_elsewhere(acme):
    run, _ = leased_run(acme.worker)
    expire(run)
    columns = ("id", "tenant_id", "parent_id", "status", "schema_version", *HEAD_FIELDS)
    with second_connection() as other, other.transaction():
        other.execute("SELECT 1 FROM ledger_run WHERE id = %s FOR UPDATE", [run.pk])
        with transaction.atomic():
            assert fence.runs_expired(by=timezone.now(), limit=10, skip_locked=True, run_columns=columns) == []
    with transaction.atomic():
        found = fence.runs_expired(by=timezone.now(), limit=10, skip_locked=True, run_columns=columns)
        assert [r[len(fence.LEASE)] for r in found] == [run.pk]
        with second_connection() as other:
            assert locked(other, "ledger_runlease", "run_id", run.pk)
            assert locked(other, "ledger_run", "id", run.pk)


def test_runs_by_id_locks_the_run_rows_alone_in_id_order(acme):
    first, _ = leased_run(acme.worker)
    second, _ = leased_run(acme.worker)
    with transaction.atomic():
        found = fence.runs_by_id(run_ids={second.pk, first.pk}, limit=None, skip_locked=False, run_columns=("id",))
        width = len(fence.LEASE)
        assert [r[width] for r in found] == sorted([first.pk, second.pk])
        with second_connection() as other:
            assert locked(other, "ledger_run", "id", first.pk)
            assert not locked(other, "ledger_runlease", "run_id", first.pk)


def test_a_transition_is_one_statement_that_counts_each_update(acme):
    run, token = leased_run(acme.worker)
    op = intended_operation(acme.worker, run, token, "k-transition")
    with transaction.atomic():
        locked_run = Run.objects.select_for_update().get(pk=run.pk)
        now = timezone.now()
        event = build_event(locked_run, type="NOTE", actor="test", fields={"n": 1}, occurred_at=now)
        values = [rows.prep(Operation, "phase", "AUTHORIZED"), op.pk, rows.prep(Operation, "phase", "PLANNED")]
        moved = chain.Update(Operation, ("phase",), ("id", "phase"), values)
        missing = chain.Update(Operation, ("phase",), ("id", "phase"), [values[0], op.pk, "DISPATCHED"])
        with CaptureQueriesContext(connection) as queries:
            result = chain.transition(updates=[moved, missing], events=[event], run=locked_run, head=HEAD_FIELDS)
        assert len(queries) == 1
        assert [row[:2] for row in result] == [(1, 0)]
        assert result[0][3] == event.event_id
    assert Operation.objects.get(pk=op.pk).phase == "AUTHORIZED"
    assert Run.objects.get(pk=run.pk).last_seq == locked_run.last_seq


def test_inserting_writes_the_events_only_with_the_row(acme):
    run, _ = leased_run(acme.worker)
    with transaction.atomic():
        locked_run = Run.objects.select_for_update().get(pk=run.pk)
        seq = locked_run.last_seq
        event = build_event(locked_run, type="NOTE", actor="test", fields={}, occurred_at=timezone.now())
        existing = RunLease.objects.get(run=run)
        names, values = rows.insert_params(existing)  # the same key as a row that exists
        kept = chain.inserting(
            names=names,
            row=values,
            model=RunLease,
            conflict=("run_id",),
            events=[event],
            run=locked_run,
            head=HEAD_FIELDS,
        )
        assert kept == []
    assert Run.objects.get(pk=run.pk).last_seq == seq
    assert not Event.objects.filter(event_id=event.event_id).exists()


def test_events_and_heads_of_many_runs_go_as_arrays_in_one_statement_each(acme):
    runs = [leased_run(acme.worker)[0] for _ in range(3)]
    with transaction.atomic():
        locked_runs = list(Run.objects.select_for_update().filter(pk__in=[r.pk for r in runs]))
        now = timezone.now()
        events = [
            build_event(r, type="NOTE", actor="test", fields={"i": i}, occurred_at=now)
            for i, r in enumerate(locked_runs)
        ]
        with CaptureQueriesContext(connection) as queries:
            stored = chain.insert_events(events)
            chain.update_heads(locked_runs, HEAD_FIELDS)
        assert len(queries) == 2
        assert sorted(event_id for _, event_id in stored) == sorted(e.event_id for e in events)
    for r in locked_runs:
        assert Run.objects.get(pk=r.pk).last_seq == r.last_seq


def test_a_charge_reserves_in_one_statement_and_takes_nothing_it_was_not_granted(acme):
    set_cost_policy(acme.tenant, run=100)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k-charge", estimate=60)
    policy = {"cost_window_s": 3600, "reservation_ttl_s": 60}
    now = timezone.now()
    starts_at, _ = window_bounds(now, 3600)
    tenant = Tenant.objects.get(pk=acme.tenant.pk)
    budgets = budgets_for(op=op, run=run, tenant=tenant, policy=policy_current(tenant=tenant)[1])
    windows_ensure(tenant=tenant, budgets=budgets, now=now, window_s=3600)
    keys = [costs.Key(b.kind.value, b.key, False) for b in budgets]

    def reservation(attempt: int) -> CostReservation:
        return CostReservation(
            tenant_id=run.tenant_id,
            run=run,
            operation=op,
            attempt=attempt,
            provider="",
            estimated_cents=60,
            state=ReservationState.RESERVED,
            created_at=now,
            expires_at=now + timedelta(seconds=policy["reservation_ttl_s"]),
        )

    with transaction.atomic():
        before = CostReservation.objects.count()
        charged = reservation(7)
        granted = costs.charge(
            keys=keys,
            tenant_id=run.tenant_id,
            starts_at=starts_at,
            estimate=60,
            run_hash=run_shard_hash(run.pk),
            spend=None,
            reservation=charged,
            tenant_at=None,
        )
        assert granted[0] is True and granted[1] is not None
        refused = costs.charge(
            keys=keys,
            tenant_id=run.tenant_id,
            starts_at=starts_at,
            estimate=60,
            run_hash=run_shard_hash(run.pk),
            spend=None,
            reservation=reservation(8),
            tenant_at=None,
        )
        assert refused[0] is False and refused[1] is None  # no window row was charged
        assert CostReservation.objects.count() == before + 1
        window = CostWindow.objects.get(pk=granted[1])
        assert window.reserved_cents == 60
        settled = costs.settle(
            reservation_id=charged.pk,
            source="RESERVED",
            target="SETTLED",
            estimate=60,
            amount=40,
            now=now,
            tenant_window=None,
        )
        assert settled[0] == 1 and settled[1] == [window.pk] and settled[3] == 1
        window.refresh_from_db()
        assert (window.reserved_cents, window.settled_cents) == (0, 40)


def test_ownership_ends_for_many_runs_in_one_statement_and_instances_move_conditionally(acme):
    runs = [leased_run(acme.worker)[0] for _ in range(2)]
    ids = [r.pk for r in runs]
    with transaction.atomic():
        assert lifespan.set_for_runs(RunLease, ids, {"owner_id": None, "worker": None}) == 2
        grants = list(LeaseGrant.objects.filter(run_id__in=ids).values_list("pk", "state"))
        state = grants[0][1]
        moved = lifespan.grants_move([pk for pk, _ in grants], source=state, target="EXPIRED", now=timezone.now())
        assert moved == {pk for pk, s in grants if s == state}
        assert (
            lifespan.grants_move([pk for pk, _ in grants], source=state, target="EXPIRED", now=timezone.now()) == set()
        )


def test_an_advisory_lock_is_held_until_the_transaction_ends(acme):
    with transaction.atomic():
        lifespan.advisory_lock("quota", 1)
        key = int.from_bytes(hashlib.blake2b(repr(("quota", 1)).encode(), digest_size=8).digest(), "big", signed=True)
        with second_connection() as other:
            assert other.execute("SELECT pg_try_advisory_xact_lock(%s)", [key]).fetchone()[0] is False
    with second_connection() as other:
        assert other.execute("SELECT pg_try_advisory_xact_lock(%s)", [key]).fetchone()[0] is True


def test_a_credential_is_read_for_share(acme):
    credential_create(tenant=acme.tenant, principal="svc-a", secret_ref="vault:kv/svc-a")
    with transaction.atomic():
        found = credentials.credential_for_share(tenant_id=acme.tenant.pk, principal="svc-a")
        assert isinstance(found, Credential) and found.principal == "svc-a"
        with second_connection() as other:
            assert locked(other, "ledger_credential", "id", found.pk)  # a rotation waits
            assert not share_locked(other, "ledger_credential", found.pk)  # another issue does not
    assert credentials.credential_for_share(tenant_id=acme.tenant.pk, principal="nobody") is None


def test_a_backfill_batch_moves_and_counts_in_one_statement(acme):
    run, token = leased_run(acme.worker)
    for i in range(3):
        intended_operation(acme.worker, run, token, f"k-backfill-{i}")
    Operation.objects.update(schema_version=1, provider_ref=None)
    last, scanned, changed = upgrades.provider_ref_batch(after="", limit=2, dry_run=True)
    assert (scanned, changed) == (2, 2)
    assert Operation.objects.filter(schema_version=2).count() == 0
    last, scanned, changed = upgrades.provider_ref_batch(after="", limit=10, dry_run=False)
    assert (scanned, changed) == (3, 3)
    assert last == str(max(Operation.objects.values_list("pk", flat=True)))
    assert upgrades.provider_ref_conflicts(after="", upto=last) == []
    assert upgrades.estimated_rows(Operation) is None  # never analyzed: the caller counts
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_operation")
    assert upgrades.estimated_rows(Operation) == 3


def test_the_verifier_reads_a_chain_in_batches_from_a_server_side_cursor(acme):
    run, token = leased_run(acme.worker)
    intended_operation(acme.worker, run, token, "k-rows")
    run.refresh_from_db()
    with evidence.event_rows(run_id=run.pk, upto=run.last_seq, columns=("seq", "event_id"), batch=1) as batches:
        got = [list(batch) for batch in batches]
    assert [len(batch) for batch in got] == [1] * run.last_seq
    assert [batch[0][0] for batch in got] == list(range(1, run.last_seq + 1))
    assert all(isinstance(batch[0][1], str) for batch in got)  # the event id as its canonical text


def test_the_planner_estimates_a_list_without_counting_it(acme):
    leased_run(acme.worker)
    with CaptureQueriesContext(connection) as queries:
        estimate = reads.estimated_count(Run.objects.all())
    assert estimate >= 0
    assert [q["sql"].startswith("EXPLAIN") for q in queries] == [True]
    assert reads.estimated_count(Run.objects.none()) == 0
    reads.ping()


def test_rows_read_and_write_one_model_without_the_orm(acme):
    run, _ = leased_run(acme.worker)
    got = rows.get(Run, tenant_id=acme.tenant.pk, id=run.pk)
    assert isinstance(got, Run) and got.pk == run.pk and got._state.adding is False
    assert rows.get(Run, tenant_id=acme.tenant.pk + 1000, id=run.pk) is None
    lease = rows.get(RunLease, ("run",), run_id=run.pk)
    assert lease is not None and lease.run.pk == run.pk  # the related row attached
    assert rows.select(CapabilityBudget, run_id=run.pk) == []
    assert rows.update(Run, {"external_id": "ext-1"}, id=run.pk) == 1
    assert Run.objects.get(pk=run.pk).external_id == "ext-1"
