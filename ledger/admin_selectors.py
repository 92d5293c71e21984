"""Reads for the admin pages (credential leases, workers, tenants), scoped to a console
user's tenants like every console read. Each returns a bounded page in a fixed number of
queries, whatever the table sizes."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, User
from django.contrib.contenttypes.models import ContentType
from django.db.models import Count, F, IntegerField, Min, Model, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from guardian.models import UserObjectPermission

from ledger.errors import ReconcileFirst
from ledger.ids import lease_id_prefix_range
from ledger.models import (
    RESTART_EPISODE_BEGINS,
    RUN_IN_FLIGHT,
    AdminAction,
    Backfill,
    CapabilityBudget,
    CostWindow,
    Credential,
    CredentialLease,
    FlowBucket,
    FlowSlot,
    LeaseGrant,
    Operation,
    ResourceAlert,
    Run,
    Runbook,
    RunLease,
    RunResource,
    SchemaChange,
    StateConflict,
    Tenant,
    TenantPolicy,
    Worker,
    WorkerBoot,
    WorkerDrain,
)
from ledger.observability.cost_report import lever_report
from ledger.pagination import PAGE_SIZE, Page, keyset_page
from ledger.policy import LEVER_STATES, flow_limits_of, levers_of, retry_budget_of
from ledger.roles import ROLES, VIEW, tenants_for
from ledger.services.authority.policy import policy_current
from ledger.services.core.admission import operations_in_doubt
from ledger.services.delivery.lookup import deliveries_pending
from ledger.services.tenancy.runbooks import NAMES as RUNBOOK_NAMES
from ledger.services.tenancy.runbooks import runbook_html
from ledger.services.upgrades.changes import KNOWN_CHANGES, change_read
from ledger.services.upgrades.fleet import fleet_builds
from ledger.states import (
    INSTANCE_LIVE,
    CapabilityStatus,
    ConflictStatus,
    InstanceState,
    LeaseEnd,
    Phase,
    ResourceState,
    UpgradePhase,
    WorkerStatus,
)

LEASE_STATES = ("active", "revoked", "expired", "all")
PREVIEW_LIMIT = 200
RECENT = 50
WORKER_LIMIT = 500
# Operations a revocation still affects: not yet dispatched ones will be refused at
# dispatch; dispatched ones are already at the provider and keep waiting for an outcome.
IN_FLIGHT = (Phase.PLANNED, Phase.PENDING_APPROVAL, Phase.AUTHORIZED, Phase.DISPATCHED)


def visible_tenants(*, user: User | AnonymousUser) -> QuerySet[Tenant]:
    return tenants_for(user, VIEW)


# --- credential leases ----------------------------------------------------------------------


def credential_lease_list(
    *,
    user: User | AnonymousUser,
    tenant: str = "",
    principal: str = "",
    state: str = "active",
    prefix: str = "",
    cursor: str | None = None,
    back: str | None = None,
    size: int = PAGE_SIZE,
) -> Page[CredentialLease]:
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
    page = keyset_page(leases, order_field="issued_at", cursor=cursor, back=back, size=size, descending=True)
    for lease in page.rows:
        lease.state = lease_state(lease, now)
    return page


def lease_state(lease: CredentialLease, now: datetime) -> str:
    if lease.revoked_at is not None:
        return "REVOKED"
    return "ACTIVE" if lease.expires_at > now else "EXPIRED"


def credentials_list(*, user: User | AnonymousUser, tenant: str = "") -> list[Credential]:
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


def credential_lease_get(*, tenant: Tenant, lease_id: object) -> CredentialLease:
    """The lease ``lease_id`` of ``tenant`` with its credential (NotFound: another tenant's)."""
    return CredentialLease.objects.of_tenant(tenant, lease_id)


def credential_leases_matching(
    *, tenant: Tenant, principal: str | None = None, prefix: str | None = None, now: datetime | None = None
) -> QuerySet[CredentialLease]:
    """The active leases a bulk revocation with these arguments would revoke, oldest first:
    the preview the console and ``revoke_credential_leases --dry-run`` show."""
    return CredentialLease.objects.revocable(tenant=tenant, principal=principal, prefix=prefix, now=now)


def revocation_preview(*, tenant: Tenant, lease_id: str = "", principal: str = "", prefix: str = "") -> dict[str, Any]:
    """What a revocation would touch, before it happens: the leases (one by id, or the
    active ones by principal and/or prefix), the runs holding them, and the operations
    in flight under them. Raises NotFound / InvalidInput for a bad selection."""
    now = timezone.now()
    leases: QuerySet[CredentialLease]
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
        # Through the leases' runs: operation_run is the index (credential_lease_id has none).
        Operation.objects.filter(
            run_id__in=leases.order_by().values("run_id"), credential_lease__in=lease_ids, phase__in=IN_FLIGHT
        )
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


def _count[M: Model](queryset: QuerySet[M], key: str) -> Coalesce:
    """A correlated COUNT(*) subquery on ``key`` = the outer pk, 0 when none."""
    counted = queryset.filter(**{key: OuterRef("pk")}).order_by().values(key).annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def worker_list(*, user: User | AnonymousUser, tenant: str = "", status: str = "") -> list[Worker]:
    """Workers visible to ``user`` with how many leases they hold now, how many they lost
    (expired or revoked under them) and how many restart episodes they began
    (``RESTART_EPISODE_BEGINS``)."""
    workers = Worker.objects.filter(tenant__in=visible_tenants(user=user)).select_related("tenant")
    if tenant:
        workers = workers.filter(tenant__slug=tenant)
    if status in WorkerStatus.values:
        workers = workers.filter(status=status)
    now = timezone.now()
    return list(
        workers.annotate(
            held=_count(RunLease.objects.filter(owner_id__isnull=False, expires_at__gt=now), "worker_id"),
            lost=_count(LeaseGrant.objects.filter(end_reason__in=(LeaseEnd.EXPIRED, LeaseEnd.REVOKED)), "worker_id"),
            episodes=_count(WorkerBoot.objects.filter(RESTART_EPISODE_BEGINS), "worker_id"),
        ).order_by("tenant__slug", "name")[:WORKER_LIMIT]
    )


def workers_for(*, user: User | AnonymousUser) -> QuerySet[Worker]:
    return Worker.objects.filter(tenant__in=visible_tenants(user=user)).select_related("tenant")


def worker_detail_parts(*, worker: Worker) -> dict[str, Any]:
    """The worker's recent lease history: each grant with how it ended and, for a lost
    lease, who took the run over and with which token; its drains; its recent boots (with
    their place in a restart episode) and how many restart episodes it began."""
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
    drains = list(WorkerDrain.objects.filter(worker=worker).order_by("-started_at")[:RECENT])
    for drain in drains:  # an open drain reports its pending deliveries live, a closed one as it quiesced
        if drain.quiesced_at is None:
            drain.deliveries_pending = deliveries_pending(worker_id=worker.pk)
    boots = list(WorkerBoot.objects.filter(worker=worker).order_by("-reported_at")[:RECENT])
    return {
        "grants": grants,
        "held": held,
        "drains": drains,
        "boots": boots,
        "episodes": WorkerBoot.objects.filter(RESTART_EPISODE_BEGINS, worker=worker).count(),
        "now": timezone.now(),
        **worker_admission(worker=worker),
    }


def worker_admission(*, worker: Worker) -> dict[str, Any]:
    """Why the worker may or may not take leases now: the last boot's refusal (with the
    effects in doubt when admission is paused for them), its stale-token window against the
    policy's limit, and the quarantine decision with its diagnostic bundle."""
    _, policy = policy_current(tenant=worker.tenant)
    paused = worker.not_ready_code == ReconcileFirst.code
    quarantine = None
    if worker.status == WorkerStatus.QUARANTINED:
        quarantine = (
            AdminAction.objects.filter(tenant_id=worker.tenant_id, action="worker.quarantine", subject=worker.name)
            .order_by("-occurred_at")
            .first()
        )
    return {
        "in_doubt": operations_in_doubt(worker).count() if paused else 0,
        "stale_limit": policy["stale_token_limit"],
        "quarantine": quarantine,
        "bundle": (quarantine.fields.get("diagnostic_bundle") if quarantine else None),
    }


# --- tenants: policy, budgets, roles, activity ----------------------------------------------


def tenant_list(*, user: User | AnonymousUser) -> list[Tenant]:
    return list(
        visible_tenants(user=user)
        .annotate(
            worker_count=_count(Worker.objects.all(), "tenant_id"),
            credential_count=_count(Credential.objects.all(), "tenant_id"),
        )
        .order_by("slug")
    )


def tenant_roles(*, tenant: Tenant) -> list[dict[str, Any]]:
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


def flow_use(*, tenant: Tenant, policy: dict[str, Any], now: datetime) -> list[dict[str, Any]]:
    """Each flow limit of ``policy`` with its use now: places held of a concurrency limit
    (for ``key:*``, over the flow keys it limits, with how many there are); tokens left
    (refilled to ``now``) and given of a rate limit's bucket."""
    concurrency, rates = flow_limits_of(policy)
    held: dict[str, int] = dict(
        FlowSlot.objects.filter(tenant=tenant, operation__isnull=False)
        .values_list("key")
        .annotate(n=Count("id"))
        .order_by()
    )
    rows = []
    for key, places in sorted(concurrency.items()):
        if key == "key:*":
            under = [k for k in held if k.startswith("key:") and k not in concurrency]
            use = f"{sum(held[k] for k in under)} held over {len(under)} flow keys (each up to {places})"
        else:
            use = f"{held.get(key, 0)} of {places} held"
        rows.append({"key": key, "limit": f"{places} in flight", "use": use})
    for key, rate in sorted(rates.items()):
        shards = list(FlowBucket.objects.filter(tenant=tenant, key=key))
        n = len(shards) or 1
        left = sum(
            min(rate["burst"] / n, s.tokens + rate["per_s"] / n * max((now - s.refilled_at).total_seconds(), 0))
            for s in shards
        )
        use = f"{left:.1f} tokens left, {sum(s.taken for s in shards)} given" if shards else "not used yet"
        if key == "key:*":
            use = "per flow key"
        rows.append({"key": key, "limit": f"{rate['per_s']:g}/s, burst {rate['burst']}", "use": use})
    return rows


def tenant_detail_parts(*, tenant: Tenant) -> dict[str, Any]:
    now = timezone.now()
    policy = policy_current(tenant=tenant)[1]
    return {
        "flow_limits": flow_use(tenant=tenant, policy=policy, now=now),
        "levers_policy": [
            {"state": state, **lever} for state in LEVER_STATES if (lever := levers_of(policy, state)) is not None
        ],
        "retry_budget": retry_budget_of(policy),
        "levers_report": lever_report(tenant_id=tenant.pk, now=now),
        "policies": list(TenantPolicy.objects.filter(tenant=tenant).order_by("-version")[:RECENT]),
        "windows": list(
            CostWindow.objects.filter(tenant=tenant, ends_at__gt=now)
            .with_totals()  # an escrowed window holds what its shards hold
            .annotate(left_cents=F("limit_cents") - F("total_reserved_cents") - F("total_settled_cents"))
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


# --- what runs hold (the resources page) -------------------------------------------------


def lifespan_overview(*, user: User | AnonymousUser) -> list[dict[str, Any]]:
    """Per visible tenant: live instances beside active operations (the article's signal of
    silent accumulation), open resources by state with the oldest, orphaned resources (open,
    of an instance whose lease is gone) and open alerts. Bounded aggregates over indexes."""
    tenants = list(visible_tenants(user=user).order_by("slug"))
    ids = [t.pk for t in tenants]
    live = dict(
        LeaseGrant.objects.filter(tenant_id__in=ids, state__in=INSTANCE_LIVE)
        .values_list("tenant_id")
        .annotate(n=Count("pk"))
    )
    reaping = dict(
        LeaseGrant.objects.filter(tenant_id__in=ids, state__in=[InstanceState.EXPIRED, InstanceState.REAPING])
        .values_list("tenant_id")
        .annotate(n=Count("pk"))
    )
    # Counted from the runs' phase counters, over index run_may_be_in_flight: the operations table
    # has no index on the phase (its changes stay HOT).
    active_ops = dict(
        Run.objects.filter(RUN_IN_FLIGHT, tenant_id__in=ids)
        .values_list("tenant_id")
        .annotate(n=Sum(F("n_pending_approval") + F("n_authorized") + F("n_dispatched")))
        .order_by()
    )
    states: dict[int, dict[str, dict[str, Any]]] = {}
    for tenant_id, state, n, oldest in (
        RunResource.objects.filter(tenant_id__in=ids)
        .exclude(state=ResourceState.RELEASED)
        .values_list("tenant_id", "state")
        .annotate(n=Count("pk"), oldest=Min("created_at"))
    ):
        states.setdefault(tenant_id, {})[state] = {"n": n, "oldest": oldest}
    orphaned = dict(
        RunResource.objects.filter(tenant_id__in=ids)
        .exclude(state=ResourceState.RELEASED)
        .filter(~Q(instance__state__in=INSTANCE_LIVE))
        .values_list("tenant_id")
        .annotate(n=Count("pk"))
    )
    alerts = dict(
        ResourceAlert.objects.filter(tenant_id__in=ids, cleared_at__isnull=True)
        .values_list("tenant_id")
        .annotate(n=Count("pk"))
    )
    return [
        {
            "tenant": t,
            "live_instances": live.get(t.pk, 0),
            "reaping_instances": reaping.get(t.pk, 0),
            "active_operations": active_ops.get(t.pk, 0),
            "by_state": [
                {"state": state, **states.get(t.pk, {}).get(state, {"n": 0, "oldest": None})}
                for state in ResourceState.values
                if state != ResourceState.RELEASED
            ],
            "orphaned": orphaned.get(t.pk, 0),
            "alerts": alerts.get(t.pk, 0),
        }
        for t in tenants
    ]


RESOURCE_FILTERS = ("open", "ACTIVE", "RELEASE_REQUESTED", "RELEASING", "CLEANUP_FAILED", "RELEASED", "alerted")


def resources_listed(
    *, user: User | AnonymousUser, tenant: str = "", state: str = "open", limit: int = 200
) -> list[RunResource]:
    """Resources of the visible tenants, oldest first: ``state`` is a ResourceState, "open"
    (anything not RELEASED) or "alerted" (an open alert)."""
    qs = RunResource.objects.filter(tenant__in=visible_tenants(user=user)).select_related(
        "tenant", "instance__worker", "alert"
    )
    if tenant:
        qs = qs.filter(tenant__slug=tenant)
    if state == "open":
        qs = qs.exclude(state=ResourceState.RELEASED)
    elif state == "alerted":
        qs = qs.filter(alert__cleared_at__isnull=True, alert__isnull=False)
    elif state in ResourceState.values:
        qs = qs.filter(state=state)
    return list(qs.order_by("created_at", "pk")[:limit])


def alerts_open(*, user: User | AnonymousUser, limit: int = 50) -> list[ResourceAlert]:
    return list(
        ResourceAlert.objects.filter(tenant__in=visible_tenants(user=user), cleared_at__isnull=True)
        .select_related("resource", "tenant")
        .order_by("-raised_at")[:limit]
    )


# --- upgrades -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChangeRow:
    change: SchemaChange
    backfill: Backfill | None  # None: not started, or not shown to this user


def upgrades_overview(*, user: User | AnonymousUser) -> dict[str, Any]:
    """The upgrades page: each schema change's phase (every signed-in user; no tenant data)
    and, for a superuser, its backfill's progress (counts across every tenant); the builds of
    the workers of the user's tenants, marked where they cannot read the version being
    written; the open StateConflicts of those tenants (oldest first); the tenants whose
    effects are held after a restore."""
    tenants = visible_tenants(user=user)
    slugs = set(tenants.values_list("slug", flat=True))
    changes = [
        ChangeRow(change_read(name), Backfill.objects.filter(name=name).first() if user.is_superuser else None)
        for name in KNOWN_CHANGES
    ]
    writing = max((row.change.to_version for row in changes if row.change.phase != UpgradePhase.EXPAND), default=1)
    builds = [b for b in fleet_builds() if b.tenant in slugs]
    conflicts = list(
        StateConflict.objects.filter(tenant__in=tenants, status=ConflictStatus.OPEN)
        .select_related("tenant")
        .order_by("found_at")[:RECENT]
    )
    return {
        "changes": changes,
        "writing": writing,
        "builds": builds,
        # Booted live workers whose build cannot read the version being written; live workers
        # that never sent a boot report are counted apart (what they read is not known).
        "behind": [b for b in builds if b.live and b.reads_up_to is not None and not b.reads(writing)],
        "unreported": [b for b in builds if b.live and b.reads_up_to is None],
        "conflicts": conflicts,
        "open_conflicts": StateConflict.objects.filter(tenant__in=tenants, status=ConflictStatus.OPEN).count(),
        "held": list(tenants.filter(effects_held=True).order_by("slug")),
    }


# --- runbooks (the tenant page's editor, the cases' guidance) ---------------------------------


def tenant_runbooks(*, tenant: Tenant) -> list[dict[str, Any]]:
    """Every runbook the tenant may write, in the documented order, with its text ("" when
    none is written) and who wrote it when (one query)."""
    written = {(r.subject, r.name): r for r in Runbook.objects.filter(tenant=tenant)}
    rows = []
    for subject, names in RUNBOOK_NAMES.items():
        for name in names:
            runbook = written.get((subject, name))
            html = runbook_html(runbook.text) if runbook else ""
            rows.append({"subject": subject, "name": name, "runbook": runbook, "html": html})
    return rows


def runbook_guides(*, tenant_id: int) -> dict[tuple[str, str], str]:
    """The tenant's runbooks as sanitised HTML by (subject, name) (one query)."""
    return {
        (subject, name): runbook_html(text)
        for subject, name, text in Runbook.objects.filter(tenant_id=tenant_id).values_list("subject", "name", "text")
    }
