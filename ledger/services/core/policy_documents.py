"""A tenant's policy documents, read once per process: a version never changes once
written (``policy_change`` makes a new one), so the document and digest of (tenant,
version) are kept after the first read. Every decision and every intent reads its policy
through here; what the *current* version is comes fresh from the tenant row each time
(the fence's locking statement, or the worker's own row)."""

from typing import Any

from ledger.models import Tenant, TenantPolicy
from ledger.policy import policy_digest

# By (tenant id, its slug, version): the slug keeps a test database whose tenant ids repeat
# from answering with another tenant's document.
_documents: dict[tuple[int, str, int], dict[str, Any]] = {}
_digests: dict[tuple[int, str, int], str] = {}
_KEPT = 4096


def policy_document(tenant: Tenant, version: int) -> dict[str, Any]:
    """The document of ``tenant``'s policy ``version`` (shared: read it, never change it)."""
    key = (tenant.pk, tenant.slug, version)
    document = _documents.get(key)
    if document is None:
        document = TenantPolicy.objects.values_list("document", flat=True).get(tenant_id=tenant.pk, version=version)
        if len(_documents) >= _KEPT:
            _documents.clear()
        _documents[key] = document
    return document


def policy_document_digest(tenant: Tenant, version: int) -> str:
    """The digest of that document, as decisions record it."""
    key = (tenant.pk, tenant.slug, version)
    digest = _digests.get(key)
    if digest is None:
        if len(_digests) >= _KEPT:
            _digests.clear()
        digest = _digests[key] = policy_digest(policy_document(tenant, version))
    return digest
