"""The schema-migration article's compatibility matrix, over HTTP with the Python client:
a worker build (old: reads version 1; new: reads 1 and 2) against the records the server
writes (old: EXPAND, version 1; new: MIGRATE, version 2). Three cells act; the fourth
(old build, new record) refuses before anything is performed, and writes nothing past the
record it could not read."""

import contextlib

import pytest

from fenceline_client import Client, Done, UnknownSchemaVersion
from ledger.models import Operation, Worker
from ledger.states import Phase, UpgradePhase
from tests.faults.schema_change import move

pytestmark = pytest.mark.django_db(transaction=True)

OLD_BUILD, NEW_BUILD = frozenset({1}), frozenset({1, 2})


@pytest.mark.parametrize(
    ("build", "records", "acts"),
    [
        pytest.param(OLD_BUILD, UpgradePhase.EXPAND, True, id="old-build/old-record"),
        pytest.param(NEW_BUILD, UpgradePhase.EXPAND, True, id="new-build/old-record"),
        pytest.param(NEW_BUILD, UpgradePhase.MIGRATE, True, id="new-build/new-record"),
        pytest.param(OLD_BUILD, UpgradePhase.MIGRATE, False, id="old-build/new-record"),
    ],
)
def test_compatibility_matrix(acme, live_server, build, records, acts):
    if records == UpgradePhase.MIGRATE:
        move(UpgradePhase.MIGRATE)
    # A worker that has not reported a boot yet: the record itself is the last line.
    Worker.objects.filter(pk=acme.worker.pk).update(boot_phase="", not_ready_code="")
    client = Client(live_server.url, acme.token, reads=build)
    run_id = client.create_run()
    performed: list[str] = []

    def perform() -> Done:
        performed.append("sent")
        return Done(provider_request_id="ch_77")

    refused = contextlib.nullcontext() if acts else pytest.raises(UnknownSchemaVersion)
    with client.lease(run_id, ttl_s=60) as lease, refused:
        lease.operation(
            tool="email",
            action="send",
            resource="mailto:x@example.com",
            effect_class="IDEMPOTENT",
            idempotency_key="matrix-1",
            perform=perform,
        )
    op = Operation.objects.get(idempotency_key="matrix-1")
    if not acts:
        assert performed == []
        assert (op.schema_version, op.phase) == (2, Phase.PLANNED)
        return
    assert performed == ["sent"]
    assert op.phase == Phase.CONFIRMED
    # Both representations, whichever build wrote it: an old reader of this record is unaffected.
    assert op.provider_request_id == "ch_77"
    assert op.provider_ref == {"provider": op.provider, "id": "ch_77"}
    assert op.schema_version == (1 if records == UpgradePhase.EXPAND else 2)
    assert client.get_operation(str(op.pk))["provider_ref"] == {"provider": op.provider, "id": "ch_77"}
