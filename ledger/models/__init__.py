"""Durable records of the ledger, one module per domain. Models hold data and constraints;
every change of state is made by a function in ``ledger/services/``."""

from ledger.models.authority import (
    CapabilityBudget,
    CostReservation,
    CostShard,
    CostWindow,
    Credential,
    CredentialLease,
    FlowBucket,
    FlowSlot,
)
from ledger.models.delivery import EffectDelivery, EffectDeliveryRecord
from ledger.models.evidence import Checkpoint, DiagnosticPayload, Event
from ledger.models.jobs import JobHeartbeat, RunTotals
from ledger.models.lifespan import ProgressCheckpoint, ResourceAlert, RunResource
from ledger.models.notifications import PersonalRoute, WebhookDelivery, WebhookEndpoint
from ledger.models.preferences import SavedView
from ledger.models.runbooks import Runbook
from ledger.models.runs import RUN_IN_FLIGHT, RUN_UNCERTAIN, FenceGeneration, LeaseGrant, Operation, Run, RunLease
from ledger.models.tenancy import (
    RESTART_EPISODE_BEGINS,
    AdminAction,
    Tenant,
    TenantPolicy,
    TokenFailureWindow,
    Worker,
    WorkerBoot,
    WorkerDrain,
)
from ledger.models.upgrades import Backfill, BackupManifest, SchemaChange, StateConflict

__all__ = [
    "RESTART_EPISODE_BEGINS",
    "RUN_IN_FLIGHT",
    "RUN_UNCERTAIN",
    "AdminAction",
    "Backfill",
    "BackupManifest",
    "CapabilityBudget",
    "Checkpoint",
    "CostReservation",
    "CostShard",
    "CostWindow",
    "Credential",
    "CredentialLease",
    "DiagnosticPayload",
    "EffectDelivery",
    "EffectDeliveryRecord",
    "Event",
    "FenceGeneration",
    "FlowBucket",
    "FlowSlot",
    "JobHeartbeat",
    "LeaseGrant",
    "Operation",
    "PersonalRoute",
    "ProgressCheckpoint",
    "ResourceAlert",
    "Run",
    "RunLease",
    "RunResource",
    "RunTotals",
    "Runbook",
    "SavedView",
    "SchemaChange",
    "StateConflict",
    "Tenant",
    "TenantPolicy",
    "TokenFailureWindow",
    "WebhookDelivery",
    "WebhookEndpoint",
    "Worker",
    "WorkerBoot",
    "WorkerDrain",
]
