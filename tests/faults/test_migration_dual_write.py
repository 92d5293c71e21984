"""Schema migration, failure injection 1 (issue 18): a worker killed during the dual-write
leaves both representations or neither; a worker that lives writes both, agreeing, at
version 2. The change is operation.provider_ref (tests/faults/schema_change.py), on real
PostgreSQL with a real process that dies."""

import os
import signal

import pytest
from django.db import connections

from ledger.models import Event, Worker
from ledger.services.fence import outcomes
from ledger.states import Outcome, Phase, UpgradePhase
from tests.factories import dispatched_operation, leased_run
from tests.faults.schema_change import all_agree, move
from tests.helpers import assert_chain_intact, spawned

pytestmark = pytest.mark.django_db(transaction=True)

# --- 1. kill a worker during the dual-write ----------------------------------------------


def _report_and_die(worker_id, op_id, token, die):
    """Report CONFIRMED with a provider id; with ``die``, SIGKILL this process after the
    dual-write's statement has gone to the database and before its COMMIT."""
    try:
        if die:
            from ledger.services.evidence.append import ChainBatch

            sent = ChainBatch.commit

            def commit_then_die(self, *args, **kwargs):
                result = sent(self, *args, **kwargs)
                if self.events and self.events[-1].type == "OPERATION_CONFIRMED":
                    os.kill(os.getpid(), signal.SIGKILL)
                return result

            ChainBatch.commit = commit_then_die
        worker = Worker.objects.get(pk=worker_id)
        outcomes.operation_report_outcome(
            worker=worker,
            operation_id=op_id,
            fencing_token=token,
            outcome=Outcome.CONFIRMED,
            provider_request_id="ch_991",
        )
    finally:
        connections.close_all()


def test_kill_a_worker_during_the_dual_write_leaves_both_representations_or_neither(acme):
    move(UpgradePhase.MIGRATE)
    run, token = leased_run(acme.worker, ttl_s=600)
    op = dispatched_operation(acme.worker, run, token, "charge-1")
    events_before = Event.objects.filter(run=run).count()

    killed = spawned(
        "tests.faults.test_migration_dual_write", "_report_and_die", acme.worker.pk, str(op.pk), token, True
    )
    killed.join(120)
    assert killed.exitcode == -signal.SIGKILL
    op.refresh_from_db()
    # Neither representation: the transaction died with the process.
    assert (op.phase, op.provider_request_id, op.provider_ref) == (Phase.DISPATCHED, "", None)
    assert Event.objects.filter(run=run).count() == events_before

    survivor = spawned(
        "tests.faults.test_migration_dual_write", "_report_and_die", acme.worker.pk, str(op.pk), token, False
    )
    survivor.join(120)
    assert survivor.exitcode == 0
    op.refresh_from_db()
    # Both, agreeing, at version 2 (MIGRATE writes the new version with the old one beside it).
    assert (op.phase, op.schema_version, op.provider_request_id) == (Phase.CONFIRMED, 2, "ch_991")
    assert op.provider_ref == {"provider": op.provider, "id": "ch_991"}
    assert all_agree()
    assert_chain_intact(run.pk)
