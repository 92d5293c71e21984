"""History for the dashboard's trends, made through the real services: to place it in past
hours, the services' clock (``django.utils.timezone.now``) is moved back while they run
(events cannot be updated). The console and the browser tests of the trends share it."""

from contextlib import contextmanager
from datetime import datetime, timedelta
from unittest import mock

import pytest
from django.utils import timezone

from approvals.services.cases import case_resolve
from approvals.services.lookups import cases_look_up
from ledger.errors import LeaseLost
from ledger.services.fence import leases, operations, outcomes
from tests.factories import leased_run, planned_op, unknown_cases, unknown_payment
from tests.helpers import sandbox_charge


def this_hour() -> datetime:
    return timezone.now().replace(minute=0, second=0, microsecond=0)


@contextmanager
def clock(at: datetime):
    """The services' clock reads ``at`` (and runs on from there) inside the block."""
    real = timezone.now
    offset = at - real()
    with mock.patch.object(timezone, "now", side_effect=lambda: real() + offset):
        yield


def refusals(identity, count: int) -> None:
    """``count`` stale-token refusals: renewals with a token that is not the run's."""
    run, token = leased_run(identity.worker)
    for _ in range(count):
        with pytest.raises(LeaseLost):
            leases.lease_renew(
                worker=identity.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token + 1, ttl_s=30
            )


def spend(identity, key: str, estimate: int, *, actual: int | None = None) -> None:
    """One dispatched operation with a cost estimate (reserved at dispatch); with ``actual``
    it is confirmed and the reservation settled at that."""
    run, token = leased_run(identity.worker, owner=f"spender-{key}")
    op = planned_op(identity, run, token, key, estimate=estimate)
    operations.operation_authorize(worker=identity.worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=identity.worker, operation_id=op.pk, fencing_token=token)
    if actual is not None:
        outcomes.operation_report_outcome(
            worker=identity.worker,
            operation_id=op.pk,
            fencing_token=token,
            outcome="CONFIRMED",
            actual_cost_cents=actual,
        )


def unknown_history(identity, hour: datetime, sandbox_provider) -> None:
    """Five hours ago two UNKNOWN effects opened; three hours ago a person settled one of
    them; an hour ago another opened and its reconciler settled it at once."""
    with clock(hour - timedelta(hours=5, minutes=-10)):
        first, _second = unknown_cases(identity.worker, 2, prefix=f"{identity.tenant.slug}-case")
    with clock(hour - timedelta(hours=3, minutes=-10)):
        case_resolve(
            case_id=first.pk, resolution="DID_NOT_HAPPEN", reason="nothing in the provider log", resolved_by="olga"
        )
    with clock(hour - timedelta(hours=1, minutes=-10)):
        key = f"{identity.tenant.slug}-pay-auto"
        unknown_payment(identity.worker, key)
        sandbox_charge(sandbox_provider, key)
        assert cases_look_up().happened == 1
