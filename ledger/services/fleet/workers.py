"""Worker identities. A worker's bearer token is shown once, at creation; only its SHA-256
is stored."""

import hashlib
import secrets

from django.db import transaction

from ledger.boundary import check_text
from ledger.errors import InvalidInput, NotFound
from ledger.models import Tenant, Worker

TOKEN_PREFIX = "flw_"  # noqa: S105 - the prefix of generated tokens, not a token


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def worker_create(*, tenant: Tenant, name: str) -> tuple[Worker, str]:
    """A new worker with a fresh token. Returns ``(worker, token)``; the token is not kept."""
    if not name or len(name) > 100:
        raise InvalidInput("worker name must be 1 to 100 characters")
    check_text(name, path="name")  # it becomes part of every event's actor
    if Worker.objects.filter(tenant=tenant, name=name).exists():
        raise InvalidInput(f"worker {name!r} already exists in tenant {tenant.slug!r}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    worker = Worker.objects.create(tenant=tenant, name=name, token_hash=token_digest(token))
    return worker, token


@transaction.atomic
def worker_rotate_token(*, worker: Worker) -> str:
    """Replace the worker's token; the old one stops working at once, and the process that
    holds the new one has reported no boot yet (a policy with
    ``admission.boot_report_required`` admits it once it does)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    Worker.objects.filter(pk=worker.pk).update(token_hash=token_digest(token), boot_phase="")
    return token


def worker_get(*, worker_id: object) -> Worker:
    raw = str(worker_id)
    worker = Worker.objects.select_related("tenant").filter(pk=raw).first() if raw.isdigit() else None
    if worker is None:
        raise NotFound("worker not found")
    return worker
