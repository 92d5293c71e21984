"""Reads, scoped to a tenant (worker API) or a user (console)."""

from django.db.models import Count

from ledger.models import Operation, Run, Tenant, Worker
from ledger.services.errors import NotFound
from ledger.services.fencing import parse_id
from ledger.services.workers import token_digest


def worker_for_token(token: str) -> Worker | None:
    return Worker.objects.select_related("tenant").filter(token_hash=token_digest(token)).first()


def run_get(*, tenant: Tenant, run_id: object) -> Run:
    run = Run.objects.select_related("lease").filter(tenant=tenant, pk=parse_id(run_id, "run")).first()
    if run is None:
        raise NotFound("run not found")
    return run


def run_phase_counts(run: Run) -> dict[str, int]:
    rows = Operation.objects.filter(run=run).values("phase").annotate(n=Count("pk")).order_by()
    return {row["phase"]: row["n"] for row in rows}
