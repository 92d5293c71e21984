"""``operation_start`` (the one call of ``POST /runs/{id}/effects``) runs its three fenced steps
in one transaction without a savepoint each: a savepoint per step made PostgreSQL create a
MultiXact for every row a later step updated after an earlier one locked it (measured: 6,142
against 496 in an 8 s benchmark phase). A step whose write raises rolls that transaction back
whole, and the call starts again with a savepoint per step, so what the refusal leaves is what
the separate calls would have left."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client import REGISTRY

from ledger.errors import EffectsHeld, NotFound, Throttled
from ledger.models import Event, Operation
from ledger.services.core.intent import Intent
from ledger.services.fence.effects import operation_start
from ledger.services.upgrades.restore import effects_hold
from tests.factories import leased_run, make_worker, set_policy


def intent(key: str) -> Intent:
    return Intent(
        tool="email", action="send", resource="mailto:ops@example.com", effect_class="IDEMPOTENT", idempotency_key=key
    )


def savepoints(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if q["sql"].upper().startswith("SAVEPOINT")]


def test_a_dispatched_effect_takes_no_savepoint_per_step(acme):
    run, token = leased_run(acme.worker)
    with CaptureQueriesContext(connection) as captured:
        started = operation_start(worker=acme.worker, run_id=run.pk, fencing_token=token, intent=intent("mail:1"))
    assert started.dispatched and started.phase == "DISPATCHED"
    # One: the call's own transaction is a savepoint of the test's; none for intend, authorize, dispatch.
    assert len(savepoints(captured)) == 1
    types = list(Event.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types[-3:] == ["OPERATION_PLANNED", "OPERATION_AUTHORIZED", "OPERATION_DISPATCHED"]


@pytest.mark.django_db(transaction=True)
def test_outside_any_transaction_the_call_takes_no_savepoint_at_all(transactional_db):
    worker = make_worker("acme", "worker-1").worker
    run, token = leased_run(worker)
    with CaptureQueriesContext(connection) as captured:
        operation_start(worker=worker, run_id=run.pk, fencing_token=token, intent=intent("mail:2"))
    assert savepoints(captured) == []


def test_a_step_whose_write_raises_keeps_the_steps_before_it(acme):
    """EFFECTS_HELD is raised inside authorize's write: the first transaction rolls back whole
    and the second, with a savepoint per step, keeps the intent PLANNED."""
    run, token = leased_run(acme.worker)
    effects_hold(by="ops", tenants=["acme"], reason="restored from backup")
    with pytest.raises(EffectsHeld):
        operation_start(worker=acme.worker, run_id=run.pk, fencing_token=token, intent=intent("mail:3"))
    op = Operation.objects.get(idempotency_key="mail:3")
    assert op.phase == "PLANNED"
    assert Event.objects.filter(run=run, type="OPERATION_PLANNED", fields__operation_id=str(op.pk)).count() == 1


def test_an_unknown_credential_lease_keeps_the_intent_and_records_it_once(acme):
    run, token = leased_run(acme.worker)
    with pytest.raises(NotFound):
        operation_start(
            worker=acme.worker,
            run_id=run.pk,
            fencing_token=token,
            intent=intent("mail:4"),
            credential_lease_id="not-a-lease",  # parse_id raises inside authorize's write
        )
    assert Operation.objects.get(idempotency_key="mail:4").phase == "PLANNED"
    assert Event.objects.filter(run=run, type="OPERATION_PLANNED").count() == 1


def throttled_count(tenant: str) -> float:
    return (
        REGISTRY.get_sample_value("fenceline_flow_throttled_total", {"tenant": tenant, "kind": "tool", "limit": "rate"})
        or 0.0
    )


def test_a_refusal_met_in_the_pass_that_is_run_again_is_counted_once(acme):
    """THROTTLED is raised inside dispatch's write: the first pass is rolled back and the call
    runs again; the refusal is met in both passes and counted once."""
    set_policy(acme.tenant, rate_limits={"tool:email": {"per_s": 0.001, "burst": 1}})
    run, token = leased_run(acme.worker)
    operation_start(worker=acme.worker, run_id=run.pk, fencing_token=token, intent=intent("mail:5"))
    before = throttled_count("acme")
    with pytest.raises(Throttled):
        operation_start(worker=acme.worker, run_id=run.pk, fencing_token=token, intent=intent("mail:6"))
    assert throttled_count("acme") == before + 1
    assert Operation.objects.get(idempotency_key="mail:6").phase == "AUTHORIZED"  # left to dispatch later
