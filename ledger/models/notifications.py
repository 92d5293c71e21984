"""Webhook notifications: a tenant's endpoints (set by its admins) and every delivery made to
them. Neither row holds a secret (invariant 6): an endpoint's signing secret is derived from a
server key and the endpoint's id and key version whenever it is needed, and a target whose URL
carries a secret (a Slack webhook) is stored as ``ref:<name>``, resolved from the settings when
a delivery is sent."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from ledger.models.tenancy import Tenant
from ledger.versioning import Versioned


class NotificationKind(models.TextChoices):
    UNKNOWN_AGED = "unknown_aged", "UNKNOWN older than the endpoint's threshold"
    APPROVAL_PENDING = "approval_pending", "an approval is pending"
    CLEANUP_ALERT = "cleanup_alert", "a cleanup alert is raised"
    QUARANTINE = "quarantine", "a worker is quarantined"
    CHAIN_BROKEN = "chain_broken", "a run's chain is BROKEN"
    BREAKER_CHANGE = "breaker_change", "the cost breaker changed"
    CASE_ESCALATED = "case_escalated", "a reconciliation case is escalated"


class PersonalKind(models.TextChoices):
    """What a person's own route carries (``PersonalRoute``), beside the tenants' kinds."""

    MY_CASE = "my_case", "a case is handed or escalated to me"
    MY_APPROVAL = "my_approval", "an approval awaits my role"


class DeliveryStatus(models.TextChoices):
    PENDING = "PENDING"
    DELIVERED = "DELIVERED"
    GAVE_UP = "GAVE_UP"


class WebhookEndpoint(Versioned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="webhook_endpoints")
    name = models.CharField(max_length=64)
    # An https URL that passed the secret boundary (http only for 127.0.0.1 / localhost), or
    # "ref:<name>", a key of settings.FENCELINE["WEBHOOK_TARGETS"].
    target = models.CharField(max_length=500)
    kinds = models.JSONField(default=list)  # NotificationKind values
    unknown_after_s = models.PositiveIntegerField(default=900)
    # The signing secret is HMAC(WEBHOOK_KEYS[key_id], "<id>:<key_version>"); a rotation bumps
    # key_version (and takes the current signing key id).
    key_id = models.CharField(max_length=64)
    key_version = models.PositiveIntegerField(default=1)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=160)

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="webhook_unique_name_per_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"


class PersonalRoute(Versioned):
    """Where one person's own notifications go ("my cases", "my approvals"): an https URL
    (checked as a tenant's webhook target is, signed with a secret derived as an endpoint's)
    or ``mailto:<address>`` (sent through Django's email backend). Set by the person on their
    settings page; what it carries is limited, at each scan, to the tenants where they still
    hold the role (``approvals/services/notifications.py``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="personal_route")
    target = models.CharField(max_length=500)
    kinds = models.JSONField(default=list)  # PersonalKind values
    key_id = models.CharField(max_length=64)
    key_version = models.PositiveIntegerField(default=1)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"route of user {self.user_id}"


class WebhookDelivery(Versioned):
    """One notification to one endpoint (or one person's route), made at most once per
    condition (``dedupe_key``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Exactly one of the two: a tenant's endpoint, or a person's own route.
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.PROTECT, null=True, blank=True, related_name="deliveries"
    )
    route = models.ForeignKey(PersonalRoute, on_delete=models.CASCADE, null=True, blank=True, related_name="deliveries")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    # A NotificationKind value (an endpoint's delivery) or a PersonalKind value (a route's).
    kind = models.CharField(max_length=32, choices=NotificationKind.choices)
    dedupe_key = models.CharField(max_length=200)
    body = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    # A short class ("timeout", "connection", "http_500", "secret_boundary"), never a response
    # body or an exception's message.
    last_error = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "dedupe_key"], name="delivery_unique_per_endpoint"),
            models.UniqueConstraint(fields=["route", "dedupe_key"], name="delivery_unique_per_route"),
            models.CheckConstraint(
                condition=Q(endpoint__isnull=True) ^ Q(route__isnull=True), name="delivery_endpoint_or_route"
            ),
            models.CheckConstraint(condition=Q(status__in=DeliveryStatus.values), name="delivery_status_valid"),
        ]
        indexes = [
            # The sender's claim: due PENDING deliveries, oldest due first.
            models.Index(fields=["next_attempt_at"], condition=Q(status=DeliveryStatus.PENDING), name="delivery_due"),
            # The console's log, newest first per tenant.
            models.Index(fields=["tenant", "-created_at"], name="delivery_recent"),
        ]
