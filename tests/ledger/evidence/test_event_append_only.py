"""Events are never updated or deleted: the database itself refuses."""

import pytest
from django.db import DatabaseError, connection, transaction

from ledger.models import Event
from tests.factories import leased_run


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_event SET type = 'OPERATION_CONFIRMED' WHERE run_id = %s",
        "UPDATE ledger_event SET fields = '{}'::jsonb WHERE run_id = %s",
        "DELETE FROM ledger_event WHERE run_id = %s",
    ],
)
def test_raw_sql_cannot_update_or_delete_events(acme, statement):
    run, _ = leased_run(acme.worker)
    before = list(Event.objects.filter(run=run).values_list("seq", "type", "hash"))
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, [run.pk])
    assert list(Event.objects.filter(run=run).values_list("seq", "type", "hash")) == before


def test_the_orm_cannot_update_or_delete_events_either(acme):
    run, _ = leased_run(acme.worker)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Event.objects.filter(run=run).update(actor="someone else")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Event.objects.filter(run=run).delete()
    assert Event.objects.filter(run=run).count() == 2
