"""Delivery evidence of an effect, apart from its execution (the audit-trail article: two
state machines): one state per operation and every record that reached it, from the worker
holding the run's lease or from a provider's signed webhook. Neither row holds a secret."""

from django.db import models
from django.db.models import Q

from ledger.models.runs import Operation
from ledger.models.tenancy import Tenant
from ledger.states import DeliveryState
from ledger.versioning import Versioned


class EffectDelivery(Versioned):
    """The delivery state of one attempt of an operation (``ledger.states.DELIVERY_TRANSITIONS``),
    changed under its run's lock by ``ledger.services.delivery``. Per attempt: a retried send
    is a new message with its own delivery."""

    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="deliveries", db_index=False)
    attempt = models.PositiveIntegerField()
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    state = models.CharField(max_length=16, choices=DeliveryState.choices)
    # The provider's message id (an email's Message-ID, a webhook delivery id) as first recorded.
    message_id = models.CharField(max_length=300, blank=True, default="")
    occurred_at = models.DateTimeField()  # when the provider says the current state happened
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "attempt"], name="delivery_one_per_attempt"),
            models.CheckConstraint(condition=Q(state__in=DeliveryState.values), name="delivery_state_valid"),
        ]
        indexes = [
            models.Index(fields=["tenant", "message_id"], condition=~Q(message_id=""), name="delivery_message_id"),
            models.Index(fields=["state"], condition=Q(state=DeliveryState.DEFERRED), name="delivery_deferred"),
        ]


class EffectDeliveryRecord(Versioned):
    """One delivery report, as it arrived, whether or not it moved the state (``applied``);
    its DELIVERY_RECORDED event is at ``seq`` of the run's chain. Never changed or deleted
    (a trigger refuses it)."""

    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="delivery_records", db_index=False)
    attempt = models.PositiveIntegerField()
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    state = models.CharField(max_length=16, choices=DeliveryState.choices)
    message_id = models.CharField(max_length=300, blank=True, default="")
    provider_event_id = models.CharField(max_length=200)
    occurred_at = models.DateTimeField()
    recorded_at = models.DateTimeField()
    actor = models.CharField(max_length=300)
    applied = models.BooleanField()
    seq = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "provider_event_id"], name="delivery_record_unique_event"),
            models.CheckConstraint(condition=Q(state__in=DeliveryState.values), name="delivery_record_state_valid"),
        ]
        indexes = [models.Index(fields=["operation", "recorded_at"], name="delivery_record_operation")]
