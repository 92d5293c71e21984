"""Approvals: payments always need a person. One request pending, one expired. The payments
contract says what a charge is, whatever a worker says, and who looks it up."""

import contextlib
from datetime import timedelta

from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services.approvals import approvals_expire
from console.demo.acting import Acting
from ledger.errors import ApprovalRequired
from ledger.services.authority.policy import policy_change
from ledger.services.fence import operations
from ledger.states import EffectClass

CONTRACTS = [
    {
        "tool": "payments",
        "action": "charge",
        "effect_class": "NON_RETRYABLE",
        "provider": "sandbox-payments",
        "reconciler": "sandbox-payments",
        "worst_case_cost_cents": 5000,
    },
    {"tool": "search", "action": "*", "effect_class": "PURE"},
]


def seed(acting: Acting) -> None:
    policy_change(
        tenant=acting.tenant,
        document={"human_approval_tools": ["payments"], "tool_contracts": CONTRACTS},
        changed_by="admin",
        reason="payments need a person; the tool contracts of payments and search",
    )
    run, token = acting.leased("demo-approvals")
    charges = [
        acting.intend(
            run,
            token,
            f"demo:charge:{n}",
            tool="payments",
            action="charge",
            resource=f"customer:{customer}",
            effect=EffectClass.NON_RETRYABLE,
        )
        for n, customer in ((17, 881), (18, 882))
    ]
    for op in charges:
        with contextlib.suppress(ApprovalRequired):
            operations.operation_authorize(worker=acting.worker, operation_id=op.pk, fencing_token=token)
    expired = charges[1]
    ApprovalRequest.objects.filter(operation=expired).update(expires_at=timezone.now() - timedelta(seconds=1))
    approvals_expire()
