"""Authority: credentials and their leases, capability budgets, cost windows and reservations."""

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

from django.db import models
from django.db.models import F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from ledger.errors import InvalidInput, NotFound, parse_id
from ledger.ids import lease_id_prefix_range
from ledger.models.runs import Operation, Run
from ledger.models.tenancy import Tenant
from ledger.states import (
    BudgetKind,
    CapabilityStatus,
    ReservationState,
)
from ledger.versioning import Versioned

if TYPE_CHECKING:  # the type checker's own package (django-stubs), not installed to run
    from django_stubs_ext import WithAnnotations


class Credential(Versioned):
    """A principal whose secret lives elsewhere: only a reference and its version are kept."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="credentials")
    principal = models.CharField(max_length=200)
    version = models.PositiveIntegerField(default=1)
    secret_ref = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "principal"], name="credential_unique_principal")]


class CredentialLeaseQuerySet(models.QuerySet["CredentialLease"]):
    def of_tenant(self, tenant: Tenant, lease_id: object) -> "CredentialLease":
        """The lease ``lease_id`` of ``tenant``, with its credential; NotFound otherwise."""
        lease = (
            self.select_related("credential").filter(tenant=tenant, pk=parse_id(lease_id, "credential lease")).first()
        )
        if lease is None:
            raise NotFound("credential lease not found")
        return lease

    def revocable(
        self, *, tenant: Tenant, principal: str | None = None, prefix: str | None = None, now: datetime | None = None
    ) -> "CredentialLeaseQuerySet":
        """The active (unrevoked, unexpired) leases of ``tenant`` a bulk revocation by
        ``principal`` and/or lease-id ``prefix`` revokes, oldest first. Both filters narrow
        each other; at least one is required, and a principal the tenant does not have is
        NotFound."""
        if principal is None and prefix is None:
            raise InvalidInput("name a principal or a lease-id prefix")
        leases = self.filter(tenant=tenant, revoked_at__isnull=True, expires_at__gt=now or timezone.now())
        if principal is not None:
            credential = Credential.objects.filter(tenant=tenant, principal=principal).first()
            if credential is None:
                raise NotFound("no credential with that principal in this tenant")
            leases = leases.filter(credential=credential)
        if prefix is not None:
            low, high = lease_id_prefix_range(prefix)
            leases = leases.filter(pk__gte=low, pk__lte=high)
        return leases.select_related("credential").order_by("issued_at", "id")


class CredentialLease(Versioned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Found through credlease_active (tenant, ...), not an index of its own.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="credential_leases", db_index=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="credential_leases")
    credential = models.ForeignKey(Credential, on_delete=models.PROTECT, related_name="leases")
    version = models.PositiveIntegerField()
    actions = models.JSONField()
    resources = models.JSONField()
    issued_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True, default="")
    revoke_reason = models.CharField(max_length=500, blank=True, default="")
    # Not a column: ACTIVE, EXPIRED or REVOKED at the time of a read, set on the leases the
    # console's selectors return (ledger.admin_selectors.lease_state) for its templates.
    state: str

    objects = CredentialLeaseQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["tenant", "revoked_at", "expires_at"], name="credlease_active")]


class CapabilityBudget(Versioned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="capabilities")
    # Found through capability_run_tool (run, tool), not an index of its own.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="capabilities", db_index=False)
    tool = models.CharField(max_length=100)
    actions = models.JSONField()
    resources = models.JSONField()
    max_calls = models.PositiveIntegerField()
    used_calls = models.PositiveIntegerField(default=0)
    max_bytes = models.BigIntegerField(null=True, blank=True)
    used_bytes = models.BigIntegerField(default=0)
    expires_at = models.DateTimeField()
    approval = models.CharField(max_length=8)
    status = models.CharField(max_length=20, choices=CapabilityStatus.choices)
    policy_version = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(used_calls__lte=F("max_calls")), name="capability_calls_within_limit"),
            models.CheckConstraint(
                condition=Q(max_bytes__isnull=True) | Q(used_bytes__lte=F("max_bytes")),
                name="capability_bytes_within_limit",
            ),
        ]
        indexes = [models.Index(fields=["run", "tool"], name="capability_run_tool")]


class WindowTotals(TypedDict):
    """What :meth:`CostWindowQuerySet.with_totals` adds to each window."""

    total_reserved_cents: int
    total_settled_cents: int


class CostWindowQuerySet(models.QuerySet["CostWindow"]):
    def with_totals(self) -> "models.QuerySet[WithAnnotations[CostWindow, WindowTotals]]":
        """Each window with ``total_reserved_cents`` and ``total_settled_cents``: its own
        columns plus those of its escrow shards (what it holds in all)."""
        shards = CostShard.objects.filter(window=OuterRef("pk")).order_by().values("window")
        # The plugin types annotate() with a TypedDict of its own, which no declared one matches
        # (typeddjango/django-stubs#3266); the declared type is what lets callers name the totals.
        return self.annotate(  # type: ignore[return-value]
            total_reserved_cents=F("reserved_cents")
            + Coalesce(Subquery(shards.annotate(n=Sum("reserved_cents")).values("n")), 0),
            total_settled_cents=F("settled_cents")
            + Coalesce(Subquery(shards.annotate(n=Sum("settled_cents")).values("n")), 0),
        )


class CostWindow(Versioned):
    """Spend of one budget key in one time window. The check constraint is invariant 7.

    A large shared window (TENANT or PROVIDER, ``shard_count`` > 0) is charged through its
    escrow shards instead of this row: ``escrowed_cents`` of its headroom is handed out to
    them (``ledger.services.authority.windows``), and what it holds in all is this row's
    columns plus theirs (``CostWindow.objects.with_totals()``)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="cost_windows")
    kind = models.CharField(max_length=16, choices=BudgetKind.choices)
    key = models.CharField(max_length=200)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    limit_cents = models.BigIntegerField()
    reserved_cents = models.BigIntegerField(default=0)
    settled_cents = models.BigIntegerField(default=0)
    escrowed_cents = models.BigIntegerField(default=0)
    shard_count = models.PositiveSmallIntegerField(default=0)

    objects = CostWindowQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "kind", "key", "starts_at"], name="costwindow_unique"),
            models.CheckConstraint(
                condition=Q(reserved_cents__gte=0, settled_cents__gte=0, escrowed_cents__gte=0)
                & Q(limit_cents__gte=F("reserved_cents") + F("settled_cents") + F("escrowed_cents")),
                name="costwindow_within_limit",
            ),
        ]


class CostShard(Versioned):
    """One escrow shard of a large shared cost window: a slice of its headroom
    (``allotted_cents``, moved here from the window's or from another shard's in the
    transaction that needs it), charged by the runs whose id hashes to it. Concurrent
    dispatches of a tenant so charge different rows instead of queueing on one. Invariant 7
    holds per shard (the check constraint), and the shards of a window are allotted exactly
    its ``escrowed_cents``: together they never hold more than its limit."""

    window = models.ForeignKey(CostWindow, on_delete=models.PROTECT, related_name="shards")
    shard = models.PositiveSmallIntegerField()
    allotted_cents = models.BigIntegerField(default=0)
    reserved_cents = models.BigIntegerField(default=0)
    settled_cents = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["window", "shard"], name="costshard_unique"),
            models.CheckConstraint(
                condition=Q(reserved_cents__gte=0, settled_cents__gte=0)
                & Q(allotted_cents__gte=F("reserved_cents") + F("settled_cents")),
                name="costshard_within_allotment",
            ),
        ]


class CostReservation(Versioned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Found through reservation_tenant_created (tenant, created_at), not an index of its own.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="cost_reservations", db_index=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="cost_reservations")
    # Found through reservation_one_per_attempt (operation, attempt), not an index of its own:
    # every dispatch in authority mode writes one, and each index is one more entry to write.
    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="cost_reservations", db_index=False)
    attempt = models.PositiveIntegerField()
    provider = models.CharField(max_length=100, blank=True, default="")
    estimated_cents = models.BigIntegerField()
    actual_cents = models.BigIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=ReservationState.choices, default=ReservationState.RESERVED)
    windows = models.ManyToManyField(CostWindow, related_name="reservations")
    # The escrow shards it was charged to, for the windows charged through one.
    shards = models.ManyToManyField(CostShard, related_name="reservations", blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "attempt"], name="reservation_one_per_attempt"),
        ]
        # The expiry job reads the RESERVED ones due in (expires_at, id) order a batch at a
        # time (issue 16): with the id in the index that is a walk from the front, not a sort
        # of everything due.
        indexes = [
            models.Index(fields=["state", "expires_at", "id"], name="reservation_state_expiry"),
            # The tenant's cost report over a recent window (by provider, retries, fallbacks).
            models.Index(fields=["tenant", "created_at"], name="reservation_tenant_created"),
            # The cents held by UNKNOWN reservations, per tenant: the few UNKNOWN rows only.
            models.Index(
                "tenant",
                name="reservation_tenant_unknown",
                include=["estimated_cents"],
                condition=Q(state=ReservationState.UNKNOWN),
            ),
        ]


class FlowSlot(Versioned):
    """One place of a concurrency limit (policy ``concurrency``): a tenant's key has one row
    per place, ``slot`` 0 .. N-1, created on first use. A dispatch takes a free place
    (``operation`` set) in the transaction that moves its operation to DISPATCHED; the
    trigger ``flowslot_release`` (migration 0042) frees it in the statement that moves the
    operation out of DISPATCHED, whichever path moves it (outcome, UNKNOWN by lease end or
    cancel grace, restore). So a place is held exactly while its operation is DISPATCHED,
    and the places held for a key are never more than its rows below N."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="flow_slots", db_index=False)
    key = models.CharField(max_length=210)
    slot = models.PositiveIntegerField()
    operation = models.ForeignKey(
        Operation, on_delete=models.PROTECT, null=True, blank=True, related_name="flow_slots", db_index=False
    )
    # When the place was last taken (kept once it is given back: idle keys are pruned by it).
    taken_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key", "slot"], name="flowslot_unique"),
            # One place per key and operation; also the trigger's way to its operation's places.
            models.UniqueConstraint(
                fields=["operation", "key"], condition=Q(operation__isnull=False), name="flowslot_one_per_operation"
            ),
        ]


class FlowBucket(Versioned):
    """One shard of a rate limit's token bucket (policy ``rate_limits``): a key of
    ``burst`` B and ``per_s`` R has n = min(FLOW_BUCKET_SHARDS, B) shards, shard i holding
    up to B // n (+1 for i < B % n) tokens and refilled at R / n per second. A dispatch
    takes one whole token from the shard its run hashes to, or from the next one that has
    one, with one UPDATE that first adds what the shard earned since ``refilled_at`` by the
    database's clock (lazily: nothing runs between dispatches). ``taken`` counts the tokens
    it gave, ``earned`` what refills added. Concurrent dispatches of a key so write different rows instead of one."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="flow_buckets", db_index=False)
    key = models.CharField(max_length=210)
    shard = models.PositiveSmallIntegerField()
    tokens = models.FloatField()
    refilled_at = models.DateTimeField()
    created_at = models.DateTimeField()
    taken = models.BigIntegerField(default=0)
    # What refills added in all (after the cap): taken == capacity + earned - tokens, always.
    earned = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key", "shard"], name="flowbucket_unique"),
            models.CheckConstraint(condition=Q(tokens__gte=0), name="flowbucket_tokens_not_negative"),
        ]
