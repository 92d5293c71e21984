"""Admission: whether a worker's last boot lets it take leases (``fleet/boots.py`` records
the boots), read from the worker row its request already loaded, and its first lease after
a ready boot (READY -> EXECUTING)."""

from ledger.errors import CredentialsNotReady, NotReady, WorkerNotAccepting
from ledger.models import Worker, WorkerBoot


def admission_refusal(worker: Worker) -> WorkerNotAccepting | None:
    """Why the worker's latest boot keeps it from taking leases (None: admitted)."""
    if worker.not_ready_code == CredentialsNotReady.code:
        return CredentialsNotReady("the worker's last boot reported its credentials not ready")
    if worker.not_ready_code:
        return NotReady("the worker's last boot reported a domain not ready")
    return None


def worker_executing(worker: Worker) -> None:
    """The worker's first lease since a ready boot: READY -> EXECUTING (writes only then)."""
    if worker.boot_phase != "READY":
        return
    Worker.objects.filter(pk=worker.pk, boot_phase="READY").update(boot_phase="EXECUTING")
    WorkerBoot.objects.filter(worker_id=worker.pk, phase="READY").update(phase="EXECUTING")
    worker.boot_phase = "EXECUTING"
