"""Tenants and worker identities. A worker's bearer token is shown once, at creation;
only its SHA-256 is stored."""

import hashlib
import secrets

from django.db import transaction
from django.utils.text import slugify

from ledger.boundary import check_text
from ledger.models import Tenant, Worker
from ledger.services.errors import InvalidInput
from ledger.services.policy import policy_create_starter

TOKEN_PREFIX = "flw_"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tenant_ensure(*, slug: str, name: str | None = None) -> tuple[Tenant, bool]:
    """The tenant with this slug, created on the starter policy when missing."""
    clean = slugify(slug)
    if not clean or clean != slug:
        raise InvalidInput("tenant must be a slug: lowercase letters, digits and dashes")
    with transaction.atomic():
        tenant, created = Tenant.objects.get_or_create(slug=clean, defaults={"name": name or clean})
        if created:
            policy_create_starter(tenant=tenant)
    return tenant, created


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
    """Replace the worker's token; the old one stops working at once."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    Worker.objects.filter(pk=worker.pk).update(token_hash=token_digest(token))
    return token
