"""Request and response bodies of the worker API. Requests are strict: wrong types are
not coerced and unknown fields are refused."""

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field, StrictInt, StrictStr

from ledger.services.authority import credential_leases, credentials
from ledger.services.fence.leases import MAX_TTL_S, MIN_TTL_S
from ledger.states import EffectClass, Phase


class In(Schema):
    model_config = ConfigDict(strict=True, extra="forbid")


Name = Annotated[StrictStr, Field(min_length=1, max_length=100)]
OwnerId = Annotated[StrictStr, Field(min_length=1, max_length=200)]
Token = Annotated[StrictInt, Field(ge=0)]
Ttl = Annotated[StrictInt, Field(ge=MIN_TTL_S, le=MAX_TTL_S)]
Cents = Annotated[StrictInt, Field(ge=0)]
Code = Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-:]+$")]
ProviderRequestId = Annotated[StrictStr, Field(min_length=1, max_length=200)]
# Written out, so that type checkers can read them; tests/unit/test_api_schemas.py holds them
# to the enums. Literal rather than the Enum: strict validation takes the JSON strings as they come.
EffectClassName = Literal["PURE", "IDEMPOTENT", "REPLAYABLE", "UNKNOWN", "NON_RETRYABLE"]
OutcomeName = Literal["CONFIRMED", "FAILED", "UNKNOWN"]


class Error(Schema):
    error: str
    detail: str


class LeaseLostError(Error):
    reason: str


class PhaseError(Error):
    phase: str


class RunCreateIn(In):
    schema_version: StrictInt
    external_id: Annotated[StrictStr, Field(min_length=1, max_length=200)] | None = None
    parent_run_id: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None


class RunCreatedOut(Schema):
    run_id: str
    status: str


class LeaseOut(Schema):
    owner_id: str | None
    fencing_token: int
    expires_at: datetime | None
    last_renewed_at: datetime | None


class RunOut(Schema):
    run_id: str
    external_id: str | None
    status: str
    schema_version: int
    created_at: datetime
    lease: LeaseOut
    chain: dict[str, Any]
    stale_rejections: int
    operations: dict[str, int]
    indicators: dict[str, dict[str, Any]]


class LeaseAcquireIn(In):
    owner_id: OwnerId
    ttl_s: Ttl


class LeaseRenewIn(In):
    owner_id: OwnerId
    fencing_token: Token
    ttl_s: Ttl


class LeaseReleaseIn(In):
    owner_id: OwnerId
    fencing_token: Token


class LeaseGrantedOut(Schema):
    fencing_token: int
    expires_at: datetime


class LeaseRenewedOut(Schema):
    expires_at: datetime


class LeaseReleasedOut(Schema):
    released: bool


class OperationIn(In):
    fencing_token: Token
    tool: Name
    action: Name
    resource: Annotated[StrictStr, Field(min_length=1, max_length=500)]
    effect_class: EffectClassName
    idempotency_key: Annotated[StrictStr, Field(min_length=1, max_length=200)]
    args_digest: Annotated[StrictStr, Field(max_length=100, pattern=r"^[A-Za-z0-9:_\-]*$")] = ""
    provider: Annotated[StrictStr, Field(max_length=100)] = ""
    estimated_cost_cents: Cents | None = None
    payload_bytes: Annotated[StrictInt, Field(ge=0)] | None = None


class OperationCreatedOut(Schema):
    operation_id: str
    phase: Phase


class OperationOut(Schema):
    operation_id: str
    run_id: str
    tool: str
    action: str
    resource: str
    effect_class: EffectClass
    idempotency_key: str
    args_digest: str
    provider: str
    phase: Phase
    attempt: int
    dispatch_token: int | None
    dispatched_at: datetime | None
    provider_request_id: str
    error_code: str
    estimated_cost_cents: int | None
    actual_cost_cents: int | None
    created_at: datetime
    updated_at: datetime


class TokenIn(In):
    fencing_token: Token


class AuthorizeIn(In):
    fencing_token: Token
    credential_lease_id: Annotated[StrictStr, Field(max_length=100)] | None = None


class AuthorizedOut(Schema):
    decision: Literal["ALLOW"]
    phase: Phase


class PhaseOut(Schema):
    phase: Phase


class OutcomeIn(In):
    fencing_token: Token
    outcome: OutcomeName
    provider_request_id: ProviderRequestId | None = None
    actual_cost_cents: Cents | None = None
    error_code: Code | None = None


class RetryDecisionOut(Schema):
    decision: Literal["STOP", "RETRY", "RETRY_SAME_KEY", "RECONCILE", "APPROVAL"]
    reason: str
    phase: Phase
    attempt: int
    effect_class: EffectClass


class EventIn(In):
    fencing_token: Token
    type: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    fields: dict[str, Any]


class EventAppendedOut(Schema):
    seq: int
    hash: str


class FenceCheckIn(In):
    run_id: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    fencing_token: Token


class FenceCheckOut(Schema):
    valid: bool


class CredentialLeaseIn(In):
    fencing_token: Token
    principal: Annotated[StrictStr, Field(min_length=1, max_length=credentials.MAX_PRINCIPAL_LENGTH)]
    actions: Annotated[
        list[Annotated[StrictStr, Field(min_length=1, max_length=credential_leases.MAX_ACTION_LENGTH)]],
        Field(min_length=1, max_length=credential_leases.MAX_LEASE_ACTIONS),
    ]
    resources: Annotated[
        list[Annotated[StrictStr, Field(min_length=1, max_length=credential_leases.MAX_RESOURCE_LENGTH)]],
        Field(min_length=1, max_length=credential_leases.MAX_LEASE_RESOURCES),
    ]
    # Bounded again by the tenant policy's max_ttl_s (422 naming the maximum).
    ttl_s: Annotated[StrictInt, Field(ge=1, le=credential_leases.MAX_LEASE_TTL_S)]


class CredentialLeaseOut(Schema):
    lease_id: str
    credential_ref: str  # where the secret is kept (e.g. vault:kv/github-bot), never the secret
    credential_version: int
    expires_at: datetime


class DecisionError(Error):
    decision: str
    budget: str | None = None


class ApprovalRequiredOut(Schema):
    decision: Literal["APPROVAL_REQUIRED"]
    approval_id: str


class CapabilityIn(In):
    fencing_token: Token
    tool: Name
    actions: Annotated[list[Name], Field(min_length=1, max_length=50)]
    resources: Annotated[
        list[Annotated[StrictStr, Field(min_length=1, max_length=500)]], Field(min_length=1, max_length=50)
    ]
    max_calls: Annotated[StrictInt, Field(ge=1)]
    max_bytes: Annotated[StrictInt, Field(ge=1)] | None = None
    ttl_s: Ttl
    approval: Literal["none", "human"] = "none"


class CapabilityOut(Schema):
    capability_id: str
    status: str
    approval_id: str | None = None


class RetryOut(Schema):
    attempt: int
    phase: Phase


class ApprovalOut(Schema):
    approval_id: str
    status: str
    kind: str
    operation_id: str | None
    capability_id: str | None
    attempt: int | None
    expires_at: datetime
    reason: str | None = None
