"""Schema migration and the fleet's builds (issue 18): an old worker meets a new record and
refuses it safely (injection 6); the change waits for the fleet, and contract refuses while
a worker whose build cannot read version 2 is live."""

import pytest

from ledger.errors import UpgradeRefused
from ledger.models import Operation, Worker
from ledger.services.upgrades.backfill import backfill_run
from ledger.services.upgrades.phases import phase_forget
from ledger.states import BackfillState, Phase, UpgradePhase
from tests.factories import READY, booted, confirm, dispatched_operation, leased_run
from tests.faults.schema_change import CHANGE, move, version_one_operations

pytestmark = pytest.mark.django_db(transaction=True)

# --- 6. present an old worker with a new record ------------------------------------------


def test_an_old_worker_meets_a_new_record_and_refuses_it_safely(acme, live_server):
    from fenceline_client import Client, Done, NotReady, UnknownSchemaVersion

    move(UpgradePhase.MIGRATE)
    old = Client(live_server.url, acme.token, reads=frozenset({1}))
    # Its boot says it reads up to version 1: the server does not admit it to meet version 2.
    booted_answer = old.boot(config_hash="cfg", code_version="build-v1", readiness=READY, honour_delay=False)
    assert "state" in booted_answer["failed_domains"]
    run_id = old.create_run()
    with pytest.raises(NotReady):
        old.lease(run_id, ttl_s=60).__enter__()
    # A worker that never reported a boot gets as far as the record, and refuses it there.
    Worker.objects.filter(pk=acme.worker.pk).update(boot_phase="", not_ready_code="")
    performed = []
    with old.lease(run_id, ttl_s=60) as lease, pytest.raises(UnknownSchemaVersion):
        lease.operation(
            tool="email",
            action="send",
            resource="mailto:x@example.com",
            effect_class="IDEMPOTENT",
            idempotency_key="new-record-1",
            perform=lambda: performed.append(1) or Done(provider_request_id="x"),
        )
    assert performed == []
    op = Operation.objects.get(idempotency_key="new-record-1")
    assert (op.schema_version, op.phase) == (2, Phase.PLANNED)  # nothing went further


# --- contract waits for the fleet ----------------------------------------------------------


def test_contract_refuses_while_an_old_worker_is_live(acme):
    version_one_operations(acme, 5)
    booted(acme.worker, reads=1)  # live, on the old build
    with pytest.raises(UpgradeRefused, match="live worker"):
        move(UpgradePhase.MIGRATE, fleet_upgraded=False)
    booted(acme.worker, reads=2)
    move(UpgradePhase.MIGRATE, fleet_upgraded=False)
    with pytest.raises(UpgradeRefused, match="still at schema_version 1"):
        move(UpgradePhase.CONTRACT, fleet_upgraded=False)
    assert backfill_run(CHANGE).state == BackfillState.DONE
    booted(acme.worker, reads=1)  # a rollback of the worker's build
    with pytest.raises(UpgradeRefused, match="worker-1 \\(build build-v1, reads up to v1\\)"):
        move(UpgradePhase.CONTRACT, fleet_upgraded=False)
    booted(acme.worker, reads=2)
    move(UpgradePhase.CONTRACT, fleet_upgraded=False)
    phase_forget()
    run, token = leased_run(acme.worker, owner="after", ttl_s=600)
    op = dispatched_operation(acme.worker, run, token, "after-contract")
    confirm(acme.worker, op, token, "ch_9")
    op.refresh_from_db()
    # Contracted: only the new representation is written.
    assert (op.schema_version, op.provider_request_id, op.provider_ref) == (
        2,
        "",
        {"provider": op.provider, "id": "ch_9"},
    )
    with pytest.raises(UpgradeRefused, match="no way back"):
        move(UpgradePhase.MIGRATE)
