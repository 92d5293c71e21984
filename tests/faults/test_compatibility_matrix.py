"""The schema-migration article's compatibility matrix, over HTTP with the Python client:
a worker build (old: reads version 1; new: reads 1 and 2) against the records the server
writes (old: EXPAND, version 1; new: MIGRATE, version 2). Three cells act; the fourth
(old build, new record) refuses before anything is performed, and writes nothing past the
record it could not read."""

import contextlib

import pytest

from fenceline_client import Client, Done, NotReady, UnknownSchemaVersion, default_readiness
from ledger.models import Operation, WorkerBoot
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
    # A worker whose boot report says it reads version 2 whatever its build (a report that is
    # wrong): admission lets it in, and the record itself is the last line.
    client = Client(live_server.url, acme.token, reads=build)
    client.boot(config_hash="cfg-matrix", code_version="matrix", readiness=default_readiness(), state_schema_version=2)
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


def test_an_old_build_whose_client_boots_first_is_refused_before_any_record(acme, live_server):
    """The first line: the client's own boot report (sent before its first lease) says the
    build reads version 1, so under MIGRATE it is not admitted and meets no record at all."""
    move(UpgradePhase.MIGRATE)
    client = Client(live_server.url, acme.token, reads=OLD_BUILD)
    run_id = client.create_run()
    with pytest.raises(NotReady):
        client.lease(run_id, ttl_s=60).__enter__()
    boot = WorkerBoot.objects.filter(worker=acme.worker).order_by("-reported_at").first()
    assert (boot.state_schema_version, boot.failed_domains) == (1, ["state"])
    assert not Operation.objects.exists()
