"""An operation's phase changes are HOT updates (issue 16, migration 0023), and so are the
updates of its run's head (migrations 0028-0029): no index of ledger_operation names a column
that authorize, dispatch or an outcome changes, no index of ledger_run names the chain head or
a phase counter those change, and the operations table leaves room on its pages for the new
row versions. A HOT update writes no index entry; one that is not HOT writes an entry into
every index of the table, which is what made the phase change the most expensive write of a
fenced transition, and the run has fifteen indexes.

Read from PostgreSQL's own counters of the current transaction, which the test runs in: an
index added on the phase (or a partial index whose condition reads it) makes this fail."""

import re

import pytest
from django.db import connection

from ledger.services.fence import operations
from tests.factories import confirm, dispatched_operation, intended_operation, leased_run

OPERATIONS = 8


def updates_so_far(table: str) -> tuple[int, int]:
    """(rows updated, of which HOT) in ``table`` by this transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_updated(%s::regclass), pg_stat_get_xact_tuples_hot_updated(%s::regclass)",
            [table, table],
        )
        updated, hot = cursor.fetchone()
    return updated, hot


def updates_while_operating(worker, run, token: int, table: str, operations: int) -> tuple[int, int]:
    """(rows updated, of which HOT) in ``table`` while ``operations`` operations of ``run`` go
    through intent, authorize, dispatch and a CONFIRMED outcome."""
    before = updates_so_far(table)
    for n in range(operations):
        op = dispatched_operation(worker, run, token, f"hot-{n}", effect_class="IDEMPOTENT")
        confirm(worker, op, token)
    after = updates_so_far(table)
    return after[0] - before[0], after[1] - before[1]


def test_authorize_dispatch_and_outcome_change_an_operation_without_touching_its_indexes(acme):
    run, token = leased_run(acme.worker)
    updated, hot = updates_while_operating(acme.worker, run, token, "ledger_operation", OPERATIONS)
    assert updated >= 3 * OPERATIONS  # authorize, dispatch, outcome: at least one update each
    assert hot == updated, f"{updated - hot} of {updated} phase changes were not HOT"


# What authorize (in authority mode too), dispatch and an outcome write into an operation.
CHANGED_BY_TRANSITIONS = (
    "phase",
    "updated_at",
    "credential_lease_id",
    "capability_id",
    "decision_code",
    "decision_policy_version",
    "dispatched_at",
    "fencing_token",
    "dispatch_owner_id",
    "policy_version_at_dispatch",
    "credential_version_at_dispatch",
    "provider_ref",
    "provider_request_id",
    "schema_version",
    "actual_cost_cents",
    "error_code",
)


def index_definitions(table: str) -> dict[str, str]:
    """Each index of ``table`` by name, with its definition (key, expressions, condition)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s::regclass",
            [table],
        )
        return dict(cursor.fetchall())


def indexes_reading(definitions: dict[str, str], columns) -> dict[str, list[str]]:
    """The indexes whose definition names any of ``columns``, with the columns each names."""
    reading = {
        name: [column for column in columns if re.search(rf"\b{column}\b", definition)]
        for name, definition in definitions.items()
    }
    return {name: named for name, named in reading.items() if named}


def test_no_index_of_the_operations_table_reads_a_column_the_transitions_change(db):
    definitions = index_definitions("ledger_operation")
    assert indexes_reading(definitions, CHANGED_BY_TRANSITIONS) == {}
    assert "operation_run" in definitions  # a run's operations still have their index


def test_the_resources_page_counts_each_tenants_open_operations_through_its_runs(acme, outsider, django_user_model):
    from ledger.admin_selectors import lifespan_overview

    run, token = leased_run(acme.worker)
    other_run, other_token = leased_run(acme.worker, owner="owner-b")
    dispatched_operation(acme.worker, run, token, "in-flight", effect_class="IDEMPOTENT")
    done = dispatched_operation(acme.worker, run, token, "done", effect_class="IDEMPOTENT")
    confirm(acme.worker, done, token)
    intended_operation(acme.worker, other_run, other_token, "authorized", "IDEMPOTENT", authorize=True)
    intended_operation(acme.worker, other_run, other_token, "planned", "IDEMPOTENT")  # PLANNED: not active yet
    outside_run, outside_token = leased_run(outsider.worker)
    dispatched_operation(outsider.worker, outside_run, outside_token, "theirs", effect_class="IDEMPOTENT")

    admin = django_user_model.objects.create_superuser("root", password="x")
    active = {row["tenant"].slug: row["active_operations"] for row in lifespan_overview(user=admin)}
    assert active == {"acme": 2, "globex": 1}  # one DISPATCHED + one AUTHORIZED; the CONFIRMED and PLANNED not


def test_a_tenants_runs_in_flight_are_read_from_their_partial_index(acme):
    """RUN_IN_FLIGHT as the breaker and the resources page filter with it matches the
    condition of index run_may_be_in_flight (else the count would read every run of the tenant)."""
    from django.db.models import Sum

    from ledger.models import RUN_IN_FLIGHT, Run

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the table is tiny: make the planner show its choice
    plan = Run.objects.filter(RUN_IN_FLIGHT, tenant=acme.tenant).values("tenant_id").annotate(n=Sum("n_dispatched"))
    assert "run_may_be_in_flight" in plan.explain()


def test_the_uncertain_filter_walks_its_partial_index_in_page_order(acme):
    from ledger.models import RUN_UNCERTAIN, Run

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
    assert "run_uncertain" in Run.objects.filter(RUN_UNCERTAIN).order_by("-created_at", "-id")[:50].explain()


RUN_OPERATIONS = 4


def page_of(run) -> int:
    """The heap page holding the version of ``run`` that this transaction sees."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT (ctid::text::point)[0]::int FROM ledger_run WHERE id = %s", [run.pk])
        return cursor.fetchone()[0]


def head_updates_of(run, step) -> tuple[int, int, bool]:
    """(head updates, of which HOT, whether the row moved to another page) while ``step`` runs."""
    page, before = page_of(run), updates_so_far("ledger_run")
    step()
    after = updates_so_far("ledger_run")
    return after[0] - before[0], after[1] - before[1], page_of(run) != page


def test_a_runs_transitions_update_its_head_without_touching_its_indexes(acme):
    """Every head update of the run happens in this test's one transaction, so none of its old
    versions can be pruned: once the page is full (other tests' runs share it), PostgreSQL puts
    the next version on another page, and that update cannot be HOT whatever the indexes are.
    So each transition is read on its own: one that was not HOT must have moved the row; one
    that kept it on its page and was still not HOT wrote index entries, which this test forbids."""
    run, token = leased_run(acme.worker)
    warm = dispatched_operation(acme.worker, run, token, "warm", effect_class="IDEMPOTENT")
    confirm(acme.worker, warm, token)
    worker = acme.worker
    for n in range(RUN_OPERATIONS):
        op = intended_operation(worker, run, token, f"hot-{n}", "IDEMPOTENT")
        steps = {
            "intend": lambda n=n: intended_operation(worker, run, token, f"hot-next-{n}", "IDEMPOTENT"),
            "authorize": lambda op=op: operations.operation_authorize(
                worker=worker, operation_id=op.pk, fencing_token=token
            ),
            "dispatch": lambda op=op: operations.operation_dispatch(
                worker=worker, operation_id=op.pk, fencing_token=token
            ),
            "outcome": lambda op=op: confirm(worker, op, token),
        }
        for name, step in steps.items():
            step_updated, step_hot, moved = head_updates_of(run, step)
            assert step_updated >= 1, f"{name} did not update the run's head"
            assert step_hot == step_updated or moved, f"{name}: {step_updated - step_hot} head updates in place not HOT"


def test_no_index_of_the_runs_table_reads_the_head_a_transition_writes(db):
    from ledger.services.evidence.append import HEAD_FIELDS

    # Written with every head, but changing only when the run ends (the flag) or an outcome is
    # UNKNOWN or reconciled (n_unknown): the indexes of runs with work in flight read them.
    changing = [name for name in HEAD_FIELDS if name not in ("may_be_in_flight", "n_unknown")]
    definitions = index_definitions("ledger_run")
    assert indexes_reading(definitions, changing) == {}
    assert {"run_uncertain", "run_may_be_in_flight"} <= set(definitions)


def flags(*runs):
    from ledger.models import Run

    return [Run.objects.get(pk=run.pk).may_be_in_flight for run in runs]


def test_a_run_leaves_the_in_flight_index_when_it_ends_with_nothing_in_flight(acme):
    from ledger.models import RUN_IN_FLIGHT, RUN_UNCERTAIN, Run
    from ledger.services.fence import runs

    done, done_token = leased_run(acme.worker, owner="done")
    confirm(acme.worker, dispatched_operation(acme.worker, done, done_token, "done"), done_token)
    doubtful, doubtful_token = leased_run(acme.worker, owner="doubtful")
    dispatched_operation(acme.worker, doubtful, doubtful_token, "left-in-flight")
    busy, busy_token = leased_run(acme.worker, owner="busy")
    intended_operation(acme.worker, busy, busy_token, "authorized", "IDEMPOTENT", authorize=True)
    idle, _ = leased_run(acme.worker, owner="idle")
    assert flags(done, doubtful, busy, idle) == [True, True, True, True]  # none has ended

    runs.run_complete(worker=acme.worker, run_id=done.pk, fencing_token=done_token)
    runs.run_complete(worker=acme.worker, run_id=doubtful.pk, fencing_token=doubtful_token)
    # Ended: out of the flag (its dispatched effect became UNKNOWN at completion: in doubt, not
    # in flight), but the UNKNOWN one stays UNCERTAIN; the unfinished runs keep their flag.
    assert flags(done, doubtful, busy, idle) == [False, False, True, True]
    assert set(Run.objects.filter(RUN_UNCERTAIN).values_list("pk", flat=True)) == {doubtful.pk}
    assert set(Run.objects.filter(RUN_IN_FLIGHT).values_list("pk", flat=True)) == {busy.pk}


def test_the_database_refuses_a_run_out_of_the_flag_with_an_operation_in_flight(acme):
    from django.db import IntegrityError, transaction

    from ledger.models import Run

    run, token = leased_run(acme.worker)
    with pytest.raises(IntegrityError, match="run_in_flight_flagged"), transaction.atomic():
        Run.objects.filter(pk=run.pk).update(may_be_in_flight=False)  # not finished
    op = dispatched_operation(acme.worker, run, token, "open")
    Run.objects.filter(pk=run.pk).update(status="COMPLETED", completed_at=op.updated_at)
    with pytest.raises(IntegrityError, match="run_in_flight_flagged"), transaction.atomic():
        Run.objects.filter(pk=run.pk).update(may_be_in_flight=False)  # finished, one dispatched


def test_the_migration_flags_the_runs_that_are_unfinished_or_have_work_in_flight(acme):
    import importlib

    from django.apps import apps

    from ledger.models import Run
    from ledger.services.fence import runs

    migration = importlib.import_module("ledger.migrations.0028_run_may_be_in_flight")
    done, done_token = leased_run(acme.worker, owner="done")
    runs.run_complete(worker=acme.worker, run_id=done.pk, fencing_token=done_token)
    active, _ = leased_run(acme.worker, owner="active")
    stopped, stopped_token = leased_run(acme.worker, owner="stopped")
    runs.run_complete(worker=acme.worker, run_id=stopped.pk, fencing_token=stopped_token)
    with connection.cursor() as cursor:  # as the rows stand right after the column's arrival
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no deferred check pending on the table
        cursor.execute("ALTER TABLE ledger_run DROP CONSTRAINT run_in_flight_flagged")
    Run.objects.update(may_be_in_flight=False)
    Run.objects.filter(pk=stopped.pk).update(n_dispatched=1)  # finished with one still in flight
    migration.flag_runs_in_flight(apps, None)
    assert flags(done, active, stopped) == [False, True, True]


# The tables a fenced transition, a lease or an authority-mode dispatch writes rows into.
WRITTEN_ON_THE_FENCED_PATH = (
    "ledger_run",
    "ledger_runlease",
    "ledger_leasegrant",
    "ledger_operation",
    "ledger_event",
    "ledger_costreservation",
    "ledger_costreservation_windows",
    "ledger_costreservation_shards",
    "ledger_credentiallease",
    "ledger_capabilitybudget",
)


def test_no_index_of_the_fenced_paths_tables_only_repeats_the_start_of_another(db):
    """A plain index on the first column(s) of another index of its table serves no lookup the
    wider one does not (a foreign key's check included), and costs an entry per row written."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH plain AS (
                SELECT i.indrelid::regclass::text AS tbl, i.indexrelid::regclass::text AS name,
                       i.indkey::text AS cols, i.indisunique AS uniq,
                       i.indpred IS NULL AND i.indexprs IS NULL AS whole, am.amname AS method
                FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
                WHERE i.indrelid = ANY(%s::regclass[])
            )
            SELECT a.name, b.name FROM plain a JOIN plain b ON a.tbl = b.tbl AND a.name <> b.name
            WHERE NOT a.uniq AND a.whole AND b.whole AND a.method = 'btree' AND b.method = 'btree'
              AND (b.cols = a.cols OR b.cols LIKE a.cols || ' %%')
            """,
            [list(WRITTEN_ON_THE_FENCED_PATH)],
        )
        repeated = dict(cursor.fetchall())
    assert repeated == {}
