"""Schema migration: a record whose two representations disagree (an old build rewrote it
during a rolling deploy) is a StateConflict that stops automation on its run only, until a
person decides it with a reason (invariant 9)."""

import pytest

from ledger.errors import StateConflictError
from ledger.models import Event, Run, StateConflict
from ledger.services.fence import leases, notes
from ledger.services.upgrades.backfill import backfill_run
from ledger.services.upgrades.conflicts import conflict_resolve
from ledger.states import ConflictStatus, Phase, UpgradePhase
from tests.factories import confirm, dispatched_operation, intended_operation, leased_run
from tests.faults.schema_change import CHANGE, move, old_build_writes
from tests.helpers import assert_chain_intact

pytestmark = pytest.mark.django_db(transaction=True)

# --- a StateConflict stops automation on that run only ------------------------------------


def test_a_state_conflict_stops_automation_on_its_run_and_only_a_person_ends_it(acme, operator):
    conflicted_run, token_a = leased_run(acme.worker, owner="a", ttl_s=600)
    healthy_run, token_b = leased_run(acme.worker, owner="b", ttl_s=600)
    op_a = dispatched_operation(acme.worker, conflicted_run, token_a, "a-1")
    confirm(acme.worker, op_a, token_a, "ch_1")
    # A rolling deploy: an old-build process rewrites the string and never knew provider_ref.
    old_build_writes(op_a, "ch_2")
    move(UpgradePhase.MIGRATE)
    done = backfill_run(CHANGE)
    assert done.conflicts == 1
    conflict = StateConflict.objects.get(status=ConflictStatus.OPEN)
    assert conflict.record == f"operation:{op_a.pk}"
    assert conflict.old_value["provider_request_id"] == "ch_2" and conflict.new_value["id"] == "ch_1"
    op_a.refresh_from_db()
    assert op_a.schema_version == 1  # not moved: nothing picks a side

    with pytest.raises(StateConflictError):
        notes.event_append(worker=acme.worker, run_id=conflicted_run.pk, fencing_token=token_a, type="NOTE", fields={})
    with pytest.raises(StateConflictError):
        intended_operation(acme.worker, conflicted_run, token_a, "a-2", "IDEMPOTENT")
    with pytest.raises(StateConflictError):
        leases.lease_renew(worker=acme.worker, run_id=conflicted_run.pk, owner_id="a", fencing_token=token_a, ttl_s=600)
    # The other run goes on.
    op_b = dispatched_operation(acme.worker, healthy_run, token_b, "b-1")
    assert op_b.phase == Phase.DISPATCHED

    with pytest.raises(Exception, match="reason"):
        conflict_resolve(conflict_id=conflict.pk, user=operator, choice="old", reason=" ")
    with pytest.raises(Exception, match="choice"):
        conflict_resolve(conflict_id=conflict.pk, user=operator, choice="whichever", reason="x")
    conflict_resolve(conflict_id=conflict.pk, user=operator, choice="old", reason="the provider's dashboard shows ch_2")
    op_a.refresh_from_db()
    assert (op_a.provider_request_id, op_a.provider_ref) == ("ch_2", {"provider": op_a.provider, "id": "ch_2"})
    assert Run.objects.get(pk=conflicted_run.pk).open_conflicts == 0
    notes.event_append(worker=acme.worker, run_id=conflicted_run.pk, fencing_token=token_a, type="NOTE", fields={})
    types = list(Event.objects.filter(run=conflicted_run).values_list("type", "actor"))
    assert ("STATE_CONFLICT_OPENED", "system:upgrade") in types
    assert ("STATE_CONFLICT_RESOLVED", "user:olga") in types
    assert_chain_intact(conflicted_run.pk)
    assert backfill_run(CHANGE, restart=True).changed == 1  # now it moves
