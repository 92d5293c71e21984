"""The reservation timeout job: expired reservations become UNKNOWN once (command, task,
beat schedule); copies at once split the backlog and look past runs busy elsewhere."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from ledger.actors import SYSTEM_RESERVATION_EXPIRY
from ledger.models import CostReservation
from ledger.services.authority import reservations
from ledger.states import BreakerState, BudgetKind, ReservationState
from tests.factories import leased_run, planned_op, set_cost_policy
from tests.helpers import assert_chain_intact, events_of, runs_held_elsewhere
from tests.ledger.authority.costs import (
    assert_ledger_reconciles,
    breaker,
    reserve,
    window,
)

# --- the reservation timeout job ----------------------------------------------------------------


def test_expired_reservations_become_unknown_once_by_command(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000, ttl_s=60)
    run, token = leased_run(acme.worker)
    stale = [planned_op(acme, run, token, f"stale-{i}", estimate=100) for i in range(3)]
    fresh = planned_op(acme, run, token, "fresh", estimate=100)
    for op in (*stale, fresh):
        reserve(acme.tenant, op)
    CostReservation.objects.filter(operation__in=stale).update(expires_at=timezone.now() - timedelta(seconds=1))

    out, err = StringIO(), StringIO()
    call_command("expire_reservations", "--batch-size", "2", stdout=out, stderr=err)

    assert out.getvalue().strip() == "expired 3 cost reservations; they are now UNKNOWN"
    assert "batch 1: 2 reservations UNKNOWN so far" in err.getvalue()
    assert "batch 2: 3 reservations UNKNOWN so far" in err.getvalue()
    states = dict(CostReservation.objects.values_list("operation_id", "state"))
    assert [states[op.pk] for op in stale] == ["UNKNOWN"] * 3 and states[fresh.pk] == "RESERVED"
    unknown = events_of(run, "COST_UNKNOWN")
    assert len(unknown) == 3
    assert {e.actor for e in unknown} == {SYSTEM_RESERVATION_EXPIRY}
    assert {e.fields["reason"] for e in unknown} == {"reservation expired"}
    assert breaker(acme.tenant) == BreakerState.UNKNOWN
    assert reservations.reservations_expire() == 0  # idempotent
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 400
    assert_ledger_reconciles(acme.tenant)
    assert_chain_intact(run.pk)


@pytest.mark.django_db(transaction=True)
def test_the_expiry_job_looks_past_reservations_whose_runs_are_busy_elsewhere(acme):
    """Copies at once (``expire_reservations --processes 2``) split the backlog: when every
    run of a batch is locked by the other copy, this one reads on past those reservations
    instead of ending its pass. Another connection holds the run of the 2 oldest."""
    set_cost_policy(acme.tenant, tenant_limit=1000, ttl_s=60)
    leased = [leased_run(acme.worker) for _ in range(3)]
    ops = []  # oldest expiry first: two on the held run, then one on each other run
    for n, (run, token) in enumerate([leased[0], leased[0], leased[1], leased[2]]):
        op = planned_op(acme, run, token, f"busy-{n}", estimate=100)
        reserve(acme.tenant, op)
        ops.append(op)
    now = timezone.now()
    for age, op in enumerate(ops):
        CostReservation.objects.filter(operation=op).update(expires_at=now - timedelta(minutes=60 - age))

    with runs_held_elsewhere([leased[0][0].pk]):
        assert reservations.reservations_expire(batch_size=2) == 2

    states = dict(CostReservation.objects.values_list("operation_id", "state"))
    assert [states[op.pk] for op in ops] == ["RESERVED", "RESERVED", "UNKNOWN", "UNKNOWN"]
    assert reservations.reservations_expire(batch_size=2) == 2  # the next pass takes them
    assert_ledger_reconciles(acme.tenant)


def test_the_expiry_task_runs_the_service(acme):
    from ledger.tasks import expire_reservations_task

    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=5)
    reserve(acme.tenant, op)
    CostReservation.objects.filter(operation=op).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert expire_reservations_task.apply().get() == {"reservations": 1}
    assert CostReservation.objects.get(operation=op).state == ReservationState.UNKNOWN


def test_the_expiry_job_is_scheduled():
    from django.conf import settings

    assert settings.CELERY_BEAT_SCHEDULE["expire-reservations"]["task"] == "ledger.tasks.expire_reservations_task"
