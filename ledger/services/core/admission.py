"""Admission: whether a worker's last boot lets it take leases (``fleet/boots.py`` records
the boots), read from the worker row its request already loaded, and its first lease after
a ready boot (READY -> EXECUTING).

A boot that was ready but found effects the worker had left in doubt (the restart article's
"unknown tool outcome: READY, admission paused") stays paused until they are decided: each
acquire then counts them again, and the first that finds none lifts the pause.

Under a policy with ``admission.boot_report_required`` a worker that has reported no boot
is not admitted (409 NOT_READY naming the missing report): readiness, the restart budget,
``runtime_audit`` and the schema-read gate are all judged on a boot report, so a worker
that never sends one would skip them all. A drained or stopped worker needs a new boot to
accept work again anyway (``fleet/boots.py``), and a rotated token clears the boot phase
(the process holding the new token has not reported yet)."""

from django.db.models import F, QuerySet

from ledger.errors import CredentialsNotReady, NotReady, ReconcileFirst, WorkerNotAccepting
from ledger.models import Operation, Worker, WorkerBoot
from ledger.policy import boot_report_required
from ledger.services.core.policy_documents import policy_document
from ledger.states import Phase


def operations_in_doubt(worker: Worker) -> QuerySet[Operation]:
    """Effects this worker dispatched whose outcome nobody has reported or decided: still
    DISPATCHED (its process may have died with them) or UNKNOWN."""
    return Operation.objects.filter(
        tenant_id=worker.tenant_id,
        phase__in=(Phase.DISPATCHED, Phase.UNKNOWN),
        run__lease_grants__worker=worker,
        run__lease_grants__fencing_token=F("fencing_token"),
    )


def admission_refusal(worker: Worker) -> WorkerNotAccepting | ReconcileFirst | None:
    """Why the worker's latest boot, or its having none, keeps it from taking leases (None:
    admitted)."""
    unbooted = _unbooted_refusal(worker) if not worker.boot_phase else None
    if unbooted is not None:
        return unbooted
    code = worker.not_ready_code
    if not code:
        return None
    if code == CredentialsNotReady.code:
        return CredentialsNotReady("the worker's last boot reported its credentials not ready")
    if code == ReconcileFirst.code:
        left = operations_in_doubt(worker).count()
        if left:
            return ReconcileFirst(
                f"admission is paused: {left} effect(s) this worker dispatched are in doubt; "
                "they are reconciled first (the provider, or an operator, decides them)"
            )
        Worker.objects.filter(pk=worker.pk, not_ready_code=code).update(not_ready_code="")
        worker.not_ready_code = ""
        return None
    return NotReady("the worker's last boot reported a domain not ready")


def _unbooted_refusal(worker: Worker) -> NotReady | None:
    """NOT_READY naming the missing boot report, when the tenant's current policy asks for one."""
    if not boot_report_required(policy_document(worker.tenant, worker.tenant.policy_version)):
        return None
    return NotReady(
        "the worker has sent no boot report (POST /workers/me/boots) and the tenant's policy "
        "(admission.boot_report_required) admits no worker without one",
        missing="boot_report",
    )


def worker_executing(worker: Worker) -> None:
    """The worker's first lease since a ready boot: READY -> EXECUTING (writes only then)."""
    if worker.boot_phase != "READY":
        return
    Worker.objects.filter(pk=worker.pk, boot_phase="READY").update(boot_phase="EXECUTING")
    WorkerBoot.objects.filter(worker_id=worker.pk, phase="READY").update(phase="EXECUTING")
    worker.boot_phase = "EXECUTING"
