"""Invariant 9: a reader given a schema_version it does not know refuses it clearly."""

import pytest

from ledger.models import Event, Operation, Run
from ledger.versioning import UnknownSchemaVersion
from tests.factories import dispatched_operation, leased_run
from tests.helpers import tampering


@pytest.mark.parametrize("model", [Run, Operation, Event])
def test_rows_from_a_newer_schema_are_refused_on_read(acme, model):
    run, token = leased_run(acme.worker)
    dispatched_operation(acme.worker, run, token, "k")
    row = model.objects.filter(**({"pk": run.pk} if model is Run else {"run": run})).first()
    with tampering():
        model.objects.filter(pk=row.pk).update(schema_version=7)
    with pytest.raises(UnknownSchemaVersion) as refused:
        model.objects.get(pk=row.pk)
    assert "schema_version 7" in str(refused.value)
    assert model._meta.label in str(refused.value)


def test_api_reports_a_newer_stored_run_as_a_conflict_not_a_crash(api_for, acme):
    client = api_for(acme)
    run_id = client.create_run()
    Run.objects.filter(pk=run_id).update(schema_version=2)
    r = client.get(f"/runs/{run_id}")
    assert (r.status, r.body["error"]) == (409, "UNKNOWN_SCHEMA_VERSION")
    assert "schema_version 2" in r.body["detail"]
