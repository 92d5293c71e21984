"""The approvals app's part of the worker API: a worker asks how a person decided.
``console/urls.py`` adds this router to the worker API (``ledger.api.api``), under the same
authentication, refusals and OpenAPI document as every other call."""

from datetime import datetime

from ninja import Router, Schema

from approvals import selectors
from ledger.api import READ
from ledger.api.auth import WorkerRequest
from ledger.api.schemas import Error

router = Router()


class ApprovalOut(Schema):
    approval_id: str
    status: str
    kind: str
    operation_id: str | None
    capability_id: str | None
    attempt: int | None
    expires_at: datetime
    reason: str | None = None


@router.get(
    "/approvals/{approval_id}",
    response={200: ApprovalOut, **READ, 404: Error},
    tags=["authority"],
    # The operation id clients were generated with, from when the call lived in ledger.api.
    operation_id="ledger_api_get_approval",
)
def get_approval(request: WorkerRequest, approval_id: str) -> dict[str, object]:
    # 404 for an unknown approval and for another tenant's. (No docstring: it would become the
    # operation's description in the OpenAPI document.)
    approval = selectors.approval_get(tenant=request.worker.tenant, approval_id=approval_id)
    return {
        "approval_id": str(approval.pk),
        "status": approval.status,
        "kind": approval.kind,
        "operation_id": str(approval.operation_id) if approval.operation_id else None,
        "capability_id": str(approval.capability_id) if approval.capability_id else None,
        "attempt": approval.attempt,
        "expires_at": approval.expires_at,
        "reason": approval.reason or None,
    }
