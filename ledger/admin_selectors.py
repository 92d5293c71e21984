"""Reads for the admin pages (credential leases, workers, tenants), scoped to a console
user's tenants like every console read. Each returns a bounded page in a fixed number of
queries, whatever the table sizes."""

from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db.models import Count, F, IntegerField, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from guardian.models import UserObjectPermission

from ledger.models import (
    AdminAction,
    CapabilityBudget,
    CostWindow,
    Credential,
    CredentialLease,
    LeaseGrant,
    Operation,
    RunLease,
    Tenant,
    TenantPolicy,
    Worker,
)
from ledger.pagination import keyset_page
from ledger.roles import ROLES, VIEW, tenants_for
from ledger.services.authority.credential_leases import (
    credential_lease_get,
    credential_leases_matching,
    lease_id_prefix_range,
)
from ledger.states import CapabilityStatus, LeaseEnd, Phase, WorkerStatus

LEASE_STATES = ("active", "revoked", "expired", "all")
PREVIEW_LIMIT = 200
RECENT = 50
WORKER_LIMIT = 500
# Operations a revocation still affects: not yet dispatched ones will be refused at
# dispatch; dispatched ones are already at the provider and keep waiting for an outcome.
IN_FLIGHT = (Phase.PLANNED, Phase.PENDING_APPROVAL, Phase.AUTHORIZED, Phase.DISPATCHED)


def visible_tenants(*, user):
    return tenants_for(user, VIEW)


# --- credential leases ----------------------------------------------------------------------


def credential_lease_list(
    *, user, tenant: str = "", principal: str = "", state: str = "active", prefix: str = "", cursor: str | None = None
):
    """Leases visible to ``user``, newest first, filtered; a bad prefix raises InvalidInput."""
    now = timezone.now()
    leases = CredentialLease.objects.filter(tenant__in=visible_tenants(user=user)).select_related(
        "credential", "tenant"
    )
    if tenant:
        leases = leases.filter(tenant__slug=tenant)
    if principal:
        leases = leases.filter(credential__principal=principal)
    if state == "active":
        leases = leases.filter(revoked_at__isnull=True, expires_at__gt=now)
    elif state == "revoked":
        leases = leases.filter(revoked_at__isnull=False)
    elif state == "expired":
        leases = leases.filter(revoked_at__isnull=True, expires_at__lte=now)
    if prefix:
        low, high = lease_id_prefix_range(prefix)
        leases = leases.filter(pk__gte=low, pk__lte=high)
    rows, next_cursor = keyset_page(leases, order_field="issued_at", cursor=cursor, descending=True)
    for lease in rows:
        lease.state = lease_state(lease, now)
    return rows, next_cursor


def lease_state(lease: CredentialLease, now: datetime) -> str:
    if lease.revoked_at is not None:
        return "REVOKED"
    return "ACTIVE" if lease.expires_at > now else "EXPIRED"


def credentials_list(*, user, tenant: str = ""):
    """Credentials visible to ``user`` with their count of active leases (one query)."""
    now = timezone.now()
    credentials = Credential.objects.filter(tenant__in=visible_tenants(user=user)).select_related("tenant")
    if tenant:
        credentials = credentials.filter(tenant__slug=tenant)
    return list(
        credentials.annotate(
            active_leases=Count("leases", filter=Q(leases__revoked_at__isnull=True, leases__expires_at__gt=now))
        ).order_by("tenant__slug", "principal")[:WORKER_LIMIT]
    )


def revocation_preview(*, tenant: Tenant, lease_id: str = "", principal: str = "", prefix: str = "") -> dict:
    """What a revocation would touch, before it happens: the leases (one by id, or the
    active ones by principal and/or prefix), the runs holding them, and the operations
    in flight under them. Raises NotFound / InvalidInput for a bad selection."""
    now = timezone.now()
    if lease_id:
        lease = credential_lease_get(tenant=tenant, lease_id=lease_id)
        leases = CredentialLease.objects.filter(pk=lease.pk).select_related("credential")
    else:
        leases = credential_leases_matching(tenant=tenant, principal=principal or None, prefix=prefix or None, now=now)
    total = leases.count()
    shown = list(leases.select_related("run")[:PREVIEW_LIMIT])
    for lease in shown:
        lease.state = lease_state(lease, now)
    lease_ids = leases.values("pk")
    operations = list(
        Operation.objects.filter(credential_lease__in=lease_ids, phase__in=IN_FLIGHT)
        .select_related("credential_lease__credential")
        .order_by("created_at", "id")[:PREVIEW_LIMIT]
    )
    runs = sorted({lease.run_id for lease in shown}, key=str)
    return {
        "leases": shown,
        "total": total,
        "revocable": sum(1 for lease in shown if lease.state != "REVOKED"),
        "runs": runs,
        "run_count": leases.order_by().values("run_id").distinct().count(),
        "operations": operations,
        "limit": PREVIEW_LIMIT,
    }


# --- workers --------------------------------------------------------------------------------


def _count(queryset, key: str):
    """A correlated COUNT(*) subquery on ``key`` = the outer pk, 0 when none."""
    counted = queryset.filter(**{key: OuterRef("pk")}).order_by().values(key).annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def worker_list(*, user, tenant: str = "", status: str = ""):
    """Workers visible to ``user`` with how many leases they hold now and how many they
    lost (restart episodes: leases that expired or were revoked under them)."""
    workers = Worker.objects.filter(tenant__in=visible_tenants(user=user)).select_related("tenant")
    if tenant:
        workers = workers.filter(tenant__slug=tenant)
    if status in WorkerStatus.values:
        workers = workers.filter(status=status)
    now = timezone.now()
    return list(
        workers.annotate(
            held=_count(RunLease.objects.filter(owner_id__isnull=False, expires_at__gt=now), "worker_id"),
            episodes=_count(
                LeaseGrant.objects.filter(end_reason__in=(LeaseEnd.EXPIRED, LeaseEnd.REVOKED)), "worker_id"
            ),
        ).order_by("tenant__slug", "name")[:WORKER_LIMIT]
    )


def workers_for(*, user):
    return Worker.objects.filter(tenant__in=visible_tenants(user=user)).select_related("tenant")


def worker_detail_parts(*, worker: Worker) -> dict:
    """The worker's recent lease history: each grant with how it ended and, for a lost
    lease (a restart episode), who took the run over and with which token."""
    takeover = LeaseGrant.objects.filter(run_id=OuterRef("run_id"), fencing_token=OuterRef("fencing_token") + 1)
    grants = list(
        LeaseGrant.objects.filter(worker=worker)
        .select_related("run")
        .annotate(
            next_owner=Subquery(takeover.values("owner_id")[:1]),
            next_token=Subquery(takeover.values("fencing_token")[:1]),
        )
        .order_by("-acquired_at", "-id")[:RECENT]
    )
    held = list(
        RunLease.objects.filter(worker=worker, owner_id__isnull=False)
        .select_related("run")
        .order_by("expires_at")[:RECENT]
    )
    return {"grants": grants, "held": held, "now": timezone.now()}


# --- tenants: policy, budgets, roles, activity ----------------------------------------------


def tenant_list(*, user):
    return list(
        visible_tenants(user=user)
        .annotate(
            worker_count=_count(Worker.objects.all(), "tenant_id"),
            credential_count=_count(Credential.objects.all(), "tenant_id"),
        )
        .order_by("slug")
    )


def tenant_roles(*, tenant: Tenant) -> list[dict]:
    """Each user with a role on ``tenant`` and the role (two queries)."""
    content_type = ContentType.objects.get_for_model(Tenant)
    perms: dict[int, set[str]] = {}
    for user_id, codename in UserObjectPermission.objects.filter(
        content_type=content_type, object_pk=str(tenant.pk)
    ).values_list("user_id", "permission__codename"):
        perms.setdefault(user_id, set()).add(f"ledger.{codename}")
    by_perms = {frozenset(p): name for name, p in ROLES.items()}
    users = get_user_model().objects.filter(pk__in=list(perms)).order_by("username")
    return [{"user": u, "role": by_perms.get(frozenset(perms[u.pk]), "custom")} for u in users]


def tenant_detail_parts(*, tenant: Tenant) -> dict:
    now = timezone.now()
    return {
        "policies": list(TenantPolicy.objects.filter(tenant=tenant).order_by("-version")[:RECENT]),
        "windows": list(
            CostWindow.objects.filter(tenant=tenant, ends_at__gt=now)
            .annotate(left_cents=F("limit_cents") - F("reserved_cents") - F("settled_cents"))
            .order_by("kind", "key")[:RECENT]
        ),
        "capabilities": list(
            CapabilityBudget.objects.filter(
                tenant=tenant,
                status__in=(CapabilityStatus.ACTIVE, CapabilityStatus.PENDING_APPROVAL),
                expires_at__gt=now,
            ).order_by("-created_at")[:RECENT]
        ),
        "roles": tenant_roles(tenant=tenant),
        "actions": list(AdminAction.objects.filter(tenant=tenant).order_by("-occurred_at", "-id")[:RECENT]),
        "now": now,
    }
