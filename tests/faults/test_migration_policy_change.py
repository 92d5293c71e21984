"""Schema migration, failure injection 3 (issue 18): a policy changed between a worker's read
and its dispatch, while the upgrade moves on, is the policy dispatch obeys: no effect, under
any version."""

import pytest

from ledger.errors import Denied
from ledger.models import Tenant
from ledger.services.authority.policy import policy_change
from ledger.services.fence import operations
from ledger.services.upgrades.backfill import backfill_run
from ledger.states import BackfillState, Phase, UpgradePhase
from tests.factories import intended_operation, leased_run
from tests.faults.schema_change import CHANGE, move

pytestmark = pytest.mark.django_db(transaction=True)

# --- 3. change policy between read and dispatch ------------------------------------------


def test_a_policy_changed_between_read_and_dispatch_is_the_policy_dispatch_obeys(acme):
    run, token = leased_run(acme.worker, ttl_s=600)
    op = intended_operation(acme.worker, run, token, "charge-2", "IDEMPOTENT")
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    # The worker has read its AUTHORIZED operation; the upgrade moves on and the policy changes.
    move(UpgradePhase.MIGRATE)
    assert backfill_run(CHANGE).state == BackfillState.DONE
    _deny_email(acme.tenant)
    with pytest.raises(Denied):
        operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    op.refresh_from_db()
    assert op.phase == Phase.DENIED and op.fencing_token is None  # no effect, under any version
    assert op.schema_version == 2


def _deny_email(tenant: Tenant) -> None:
    from ledger.services.authority.policy import policy_current

    _, document = policy_current(tenant=tenant)
    policy_change(
        tenant=tenant,
        document={**document, "human_approval_tools": ["email"]},
        changed_by="admin",
        reason="email needs a person from now on",
    )
