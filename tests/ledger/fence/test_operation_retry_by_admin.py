"""An admin's retry of an operation from the console (issue 40): the worker's own retry step
(decision, refusals recorded, approval, new attempt) with the admin as the actor and their
reason; a NON_RETRYABLE operation goes through an approval, used once approved; 403 for
every other role; the worker's replay of its intent then finds the new attempt."""

import pytest

from approvals.models import ApprovalRequest
from approvals.services.approvals import approval_decide
from ledger.errors import ApprovalRequired, Forbidden, ReconcileFirst, RunCancelled
from ledger.models import AdminAction, Operation
from ledger.services.fence import outcomes
from ledger.services.fence.ending import run_cancel
from ledger.services.fence.operations import Intent, operation_intend
from ledger.services.fence.retry import RETRY_ACTION, operation_retry_by_admin
from ledger.states import Phase
from tests.factories import dispatched_operation, leased_run
from tests.helpers import assert_chain_intact, events_of


def failed(acme, effect_class: str, key: str = "send-1"):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, key, effect_class)
    outcomes.operation_report_outcome(
        worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="FAILED", error_code="smtp_421"
    )
    return run, token, Operation.objects.get(pk=op.pk)


def test_an_admin_retries_a_failed_idempotent_operation_as_the_next_attempt(acme, admin):
    run, token, op = failed(acme, "IDEMPOTENT")

    retried = operation_retry_by_admin(user=admin, operation_id=op.pk, reason="provider fixed its outage")

    assert (retried.phase, retried.attempt) == (Phase.PLANNED, 2)
    (planned,) = [e for e in events_of(run, "OPERATION_PLANNED") if e.fields.get("attempt") == 2]
    assert planned.actor == "user:ada"
    assert "provider fixed its outage" in planned.fields["reason"]
    assert AdminAction.objects.get(action=RETRY_ACTION).subject == str(op.pk)
    # The holder's replay of its intent (same key, same parameters) finds attempt 2.
    replay, _ = operation_intend(
        worker=acme.worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool="email",
            action="send",
            resource="mailto:x@example.com",
            effect_class="IDEMPOTENT",
            idempotency_key="send-1",
        ),
    )
    assert (replay.pk, replay.attempt, replay.phase) == (op.pk, 2, Phase.PLANNED)
    assert_chain_intact(run.pk)


def test_a_non_retryable_operation_goes_through_an_approval_first(acme, admin, approver):
    run, token, op = failed(acme, "NON_RETRYABLE")

    with pytest.raises(ApprovalRequired) as asked:
        operation_retry_by_admin(user=admin, operation_id=op.pk, reason="customer asked again")
    approval = ApprovalRequest.objects.get(pk=asked.value.approval_id)
    assert (approval.kind, approval.attempt, approval.fencing_token) == ("RETRY", 1, token)
    assert Operation.objects.get(pk=op.pk).phase == Phase.FAILED
    (requested,) = events_of(run, "APPROVAL_REQUESTED")
    assert requested.actor == "user:ada"

    approval_decide(approval_id=approval.pk, approve=True, reason="ok, once", user=approver)
    retried = operation_retry_by_admin(user=admin, operation_id=op.pk, reason="approved now")

    assert (retried.phase, retried.attempt) == (Phase.PLANNED, 2)
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "USED"
    assert_chain_intact(run.pk)


def test_an_unknown_outcome_is_reconciled_first(acme, admin):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "maybe-sent", "IDEMPOTENT")
    outcomes.operation_report_outcome(worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN")
    with pytest.raises(ReconcileFirst):
        operation_retry_by_admin(user=admin, operation_id=op.pk, reason="try again")
    (refused,) = events_of(run, "RETRY_REFUSED")
    assert refused.actor == "user:ada" and refused.fields["code"] == "RECONCILE_FIRST"
    assert Operation.objects.get(pk=op.pk).phase == Phase.UNKNOWN


def test_a_cancelled_run_takes_no_retry(acme, admin):
    run, _, op = failed(acme, "IDEMPOTENT")
    run_cancel(tenant=acme.tenant, run_id=run.pk, reason="stop", actor="user:ada")
    with pytest.raises(RunCancelled):
        operation_retry_by_admin(user=admin, operation_id=op.pk, reason="try again")
    assert Operation.objects.get(pk=op.pk).phase == Phase.FAILED


@pytest.mark.parametrize("role", ["viewer", "operator", "approver", None])
def test_only_an_admin_may_retry(acme, people, role):
    _, _, op = failed(acme, "IDEMPOTENT")
    with pytest.raises(Forbidden):
        operation_retry_by_admin(user=people[role], operation_id=op.pk, reason="no")
    assert Operation.objects.get(pk=op.pk).phase == Phase.FAILED


def test_another_tenants_admin_may_not_retry(acme, outsider_admin):
    _, _, op = failed(acme, "IDEMPOTENT")
    with pytest.raises(Forbidden):
        operation_retry_by_admin(user=outsider_admin, operation_id=op.pk, reason="no")
