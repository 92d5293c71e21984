"""An operation's phase changes are HOT updates (issue 16, migration 0023): no index of
ledger_operation names a column that authorize, dispatch or an outcome changes, and the table
leaves room on its pages for the new row versions. A HOT update writes no index entry; one
that is not HOT writes an entry into every index of the table, which is what made the phase
change the most expensive write of a fenced transition.

Read from PostgreSQL's own counters of the current transaction, which the test runs in: an
index added on the phase (or a partial index whose condition reads it) makes this fail."""

import re

from django.db import connection

from tests.ledger.factories import confirm, dispatched_operation, intended_operation, leased_run

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


def test_authorize_dispatch_and_outcome_change_an_operation_without_touching_its_indexes(acme):
    run, token = leased_run(acme.worker)
    before = updates_so_far("ledger_operation")
    for n in range(OPERATIONS):
        op = dispatched_operation(acme.worker, run, token, f"hot-{n}", effect_class="IDEMPOTENT")
        confirm(acme.worker, op, token)
    after = updates_so_far("ledger_operation")
    updated, hot = after[0] - before[0], after[1] - before[1]
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
    "dispatch_token",
    "dispatch_owner_id",
    "policy_version_at_dispatch",
    "credential_version_at_dispatch",
    "provider_ref",
    "provider_request_id",
    "schema_version",
    "actual_cost_cents",
    "error_code",
)


def test_no_index_of_the_operations_table_reads_a_column_the_transitions_change(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
            "WHERE indrelid = 'ledger_operation'::regclass"
        )
        definitions = dict(cursor.fetchall())
    reading = {
        name: [column for column in CHANGED_BY_TRANSITIONS if re.search(rf"\b{column}\b", definition)]
        for name, definition in definitions.items()
    }
    assert {name: columns for name, columns in reading.items() if columns} == {}
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
    condition of index run_in_flight (else the count would read every run of the tenant)."""
    from django.db.models import Sum

    from ledger.models import RUN_IN_FLIGHT, Run

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the table is tiny: make the planner show its choice
    plan = Run.objects.filter(RUN_IN_FLIGHT, tenant=acme.tenant).values("tenant_id").annotate(n=Sum("n_dispatched"))
    assert "run_in_flight" in plan.explain()
