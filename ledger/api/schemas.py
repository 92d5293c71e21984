"""Request and response bodies of the worker API. Requests are strict: wrong types are
not coerced and unknown fields are refused.

Every bound here is read from the column the value is stored in (``ledger/api/columns.py``):
string lengths from ``CharField.max_length``, integer ranges from the column type, narrowed
to JSON-safe integers. ``tests/unit/test_api_schemas.py`` holds every request field to a
bound, so a new field cannot reach the database unbounded."""

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ledger.api.columns import WHOLE, bounds, length
from ledger.models import (
    CapabilityBudget,
    Credential,
    LeaseGrant,
    Operation,
    ProgressCheckpoint,
    Run,
    RunLease,
    RunResource,
)
from ledger.services.authority import credential_leases, credentials
from ledger.services.core.decisions import MAX_REASON_LENGTH
from ledger.services.evidence.append import WORKER_EVENT_TYPE
from ledger.services.fence.leases import MAX_TTL_S, MIN_TTL_S
from ledger.services.lifespan import resources
from ledger.states import EffectClass, Phase, ResourceKind
from ledger.versioning import CURRENT_SCHEMA_VERSION, KNOWN_SCHEMA_VERSIONS

# What ledger/storable.py lets through, as JSON Schema can say it: no NUL in any string or
# key, no float of magnitude 1e16 or more. (Lone surrogates and -0.0 are refused too; JSON
# Schema has no words for them.)
NO_NUL = "^[^\\u0000]*$"
STORABLE_JSON_REF = "#/components/schemas/StorableJSON"
STORABLE_JSON = {
    "description": "Any JSON value PostgreSQL stores byte for byte (ledger/storable.py).",
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": "integer"},
        {"type": "number", "exclusiveMinimum": -1e16, "exclusiveMaximum": 1e16},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": {"$ref": STORABLE_JSON_REF}},
        {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": {"$ref": STORABLE_JSON_REF}},
    ],
}

EVENT_FIELDS = {
    "type": "object",
    "description": "At most 16 KB as compact JSON; no credential-like key or value (ledger/boundary/).",
    "propertyNames": {"pattern": NO_NUL},
    "additionalProperties": {"$ref": STORABLE_JSON_REF},
}

CHECKPOINT_STATE = {
    **EVENT_FIELDS,
    "description": "At most 64 KB as compact JSON; no credential-like key or value (ledger/boundary/).",
}
EVENT_PAYLOAD = {
    **EVENT_FIELDS,
    "description": (
        "The event's diagnostic payload, kept beside the chain (which commits to its digest) for the "
        "tenant's retention of its payload_class; at most 64 KB as compact JSON; no credential-like key "
        "or value (ledger/boundary/). docs/architecture.md, Data planes."
    ),
}
BOOT_EVIDENCE = {
    **EVENT_FIELDS,
    "description": "What the check saw: at most 4 KB as compact JSON; no credential-like key or value (ledger/boundary/).",
    "default": {},
}
# Request properties described by hand: pydantic cannot write a recursive schema for dict[str, Any].
STORABLE_OBJECT_PROPERTIES = {
    ("EventIn", "fields"): EVENT_FIELDS,
    ("EventIn", "payload"): EVENT_PAYLOAD,
    ("CheckpointIn", "state"): CHECKPOINT_STATE,
    ("DomainReadiness", "evidence"): BOOT_EVIDENCE,
}


def _no_nul_in_strings(schema: dict[str, Any]) -> None:
    """Every string of a request schema says it holds no NUL (the body parser refuses one)."""
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "string" and "pattern" not in node and "enum" not in node:
                node["pattern"] = NO_NUL
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


class In(Schema):
    model_config = ConfigDict(strict=True, extra="forbid", json_schema_extra=_no_nul_in_strings)


Name = Annotated[StrictStr, Field(min_length=1, max_length=length(Operation, "tool"))]
OwnerId = Annotated[StrictStr, Field(min_length=1, max_length=length(RunLease, "owner_id"))]
Token = Annotated[StrictInt, bounds(RunLease, "fencing_token", ge=0), WHOLE]
Ttl = Annotated[StrictInt, Field(ge=MIN_TTL_S, le=MAX_TTL_S), WHOLE]
EstimatedCents = Annotated[StrictInt, bounds(Operation, "estimated_cost_cents", ge=0), WHOLE]
ActualCents = Annotated[StrictInt, bounds(Operation, "actual_cost_cents", ge=0), WHOLE]
Code = Annotated[
    StrictStr, Field(min_length=1, max_length=length(Operation, "error_code"), pattern=r"^[A-Za-z0-9_.\-:]+$")
]
ProviderRequestId = Annotated[StrictStr, Field(min_length=1, max_length=length(Operation, "provider_request_id"))]
RunId = Annotated[StrictStr, Field(min_length=1, max_length=64)]  # a UUID; anything else names no run
# The enum tells clients which versions this build reads; any other is 422 UNKNOWN_SCHEMA_VERSION.
SchemaVersion = Annotated[
    StrictInt, bounds(Run, "schema_version"), Field(json_schema_extra={"enum": sorted(KNOWN_SCHEMA_VERSIONS)}), WHOLE
]
Resource = Annotated[StrictStr, Field(min_length=1, max_length=length(Operation, "resource"))]
# Written out, so that type checkers can read them; tests/unit/test_api_schemas.py holds them
# to the enums. Literal rather than the Enum: strict validation takes the JSON strings as they come.
EffectClassName = Literal["PURE", "IDEMPOTENT", "REPLAYABLE", "UNKNOWN", "NON_RETRYABLE"]
OutcomeName = Literal["CONFIRMED", "FAILED", "UNKNOWN"]


class Error(Schema):
    error: str
    detail: str


class ThrottledError(Error):
    retry_after_s: int


class LeaseLostError(Error):
    reason: str


class PhaseError(Error):
    phase: str


class FieldProblem(Schema):
    field: str  # a dotted path (fields.a.0); a key that is not identifier-like reads "*"
    problem: str


class InvalidOut(Error):
    """422: VALIDATION_ERROR with the fields at fault, FORBIDDEN_FIELD with the path and the
    rule of the secret boundary, or another domain code (IDEMPOTENCY_MISMATCH ...)."""

    fields: list[FieldProblem] | None = None
    path: str | None = None
    rule: str | None = None
    limit: int | None = None  # the bound exceeded, e.g. JSON_MAX_DEPTH for a body nested too deep


class RunCreateIn(In):
    # The run record's version; optional: this build's current one (ledger/versioning.py).
    schema_version: SchemaVersion = CURRENT_SCHEMA_VERSION
    external_id: Annotated[StrictStr, Field(min_length=1, max_length=length(Run, "external_id"))] | None = None
    parent_run_id: RunId | None = None
    # At most the policy's max_runtime_s (86400 s on the starter policy); the run ends
    # TIMED_OUT once it is older. Default: the policy's.
    max_runtime_s: Annotated[StrictInt, Field(ge=1, le=2**31 - 1), WHOLE] | None = None


class RunCreatedOut(Schema):
    run_id: str
    status: str


class LeaseOut(Schema):
    owner_id: str | None
    fencing_token: int
    expires_at: datetime | None
    last_renewed_at: datetime | None


class CancelOut(Schema):
    """A cancellation (or the timeout) under way or done: what it ends as, why, who asked,
    and until when DISPATCHED effects may still report."""

    run_status: str
    ending: str
    reason: str
    requested_by: str
    requested_at: datetime | None
    grace_until: datetime | None


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
    deadline_at: datetime | None
    cancel: CancelOut | None
    # The run-lease article's states that hold now (PROCESS_ALIVE, LEASE_VALID, LEASE_LOST,
    # OUTCOME_UNKNOWN, RECONCILIATION_REQUIRED), open cases and the time spent in UNKNOWN.
    liveness: dict[str, Any]


# A person's or a worker's reason is stored stripped and may not be blank
# (ledger/services/core/decisions.py): at least one character that is neither NUL nor
# whitespace as Python's str.strip() sees it (which counts U+0085 and U+001C-U+001F).
_PY_SPACE = "".join(f"\\u{ord(c):04x}" for c in map(chr, range(0x10000)) if c.isspace())
Reason = Annotated[
    StrictStr,
    Field(min_length=1, max_length=MAX_REASON_LENGTH, pattern=f"^[^\\u0000]*[^\\u0000{_PY_SPACE}][^\\u0000]*$"),
]


class CancelIn(In):
    reason: Reason


class CancelledOut(Schema):
    run_id: str
    status: str
    cancel: CancelOut | None


class LeaseAcquireIn(In):
    owner_id: OwnerId
    ttl_s: Ttl
    # What this instance is for (e.g. "browser"): the policy's instances_per_tool quota.
    tool: Annotated[StrictStr, Field(min_length=1, max_length=length(LeaseGrant, "tool"))] | None = None


class LeaseRenewIn(In):
    owner_id: OwnerId
    fencing_token: Token
    ttl_s: Ttl


class LeaseReleaseIn(In):
    owner_id: OwnerId
    fencing_token: Token


class ProgressCheckpointOut(Schema):
    checkpoint_id: str
    seq: int
    position: str
    state: dict[str, Any]
    digest: str
    created_at: datetime


class LeaseGrantedOut(Schema):
    fencing_token: int
    expires_at: datetime
    # The run's latest progress checkpoint, to resume from (null before the first one).
    checkpoint: ProgressCheckpointOut | None = None


class CheckpointIn(In):
    fencing_token: Token
    position: Annotated[StrictStr, Field(min_length=1, max_length=length(ProgressCheckpoint, "position"))]
    # The published schema says so: CHECKPOINT_STATE (set by ledger.api.FencelineAPI).
    state: dict[str, Any]


class CheckpointSavedOut(Schema):
    checkpoint_id: str
    seq: int
    digest: str


class LeaseRenewedOut(Schema):
    expires_at: datetime
    run_status: str
    # Set once the run is cancelled or timed out: stop new work, report what is in flight
    # before grace_until, then release the lease.
    cancel: CancelOut | None = None


class DrainIn(In):
    deadline_s: Annotated[StrictInt, Field(ge=1, le=7 * 86400), WHOLE]
    reason: Reason | None = None


class DomainReadiness(In):
    ok: bool
    # What the check saw (a storable JSON object of at most 4 KB, through the secret boundary).
    evidence: dict[str, Any] = {}


class Readiness(In):
    runtime: DomainReadiness
    state: DomainReadiness
    credentials: DomainReadiness
    outbound_delivery: DomainReadiness
    admission: DomainReadiness


def _date_time(value: str) -> str:
    """An ISO 8601 date-time with its offset (a string, never a number coerced into one),
    given on in its normal form."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("not an ISO 8601 date-time") from None  # the message never echoes the value
    if parsed.tzinfo is None:
        raise ValueError("a date-time needs its UTC offset, e.g. 2026-12-04T05:00:00Z")
    return parsed.isoformat()


class BootError(In):
    # What the process failed with while starting; "migration" quarantines the worker.
    kind: Literal["config", "migration", "credentials", "dependency", "crash"]
    message: Annotated[StrictStr, Field(min_length=1, max_length=500)]
    at: Annotated[
        StrictStr,
        Field(min_length=10, max_length=40, json_schema_extra={"format": "date-time"}),
        AfterValidator(_date_time),
    ]


# The one rule of a boot report that spans two fields (ledger/services/fleet/boots.py), in
# JSON Schema's words so that the published schema says it too.
MIGRATION_LEAVES_STATE_NOT_READY = {
    "if": {
        "properties": {
            "error": {"type": "object", "properties": {"kind": {"const": "migration"}}, "required": ["kind"]}
        },
        "required": ["error"],
    },
    "then": {"properties": {"readiness": {"properties": {"state": {"properties": {"ok": {"const": False}}}}}}},
}


def _boot_schema(schema: dict[str, Any]) -> None:
    _no_nul_in_strings(schema)
    schema.update(MIGRATION_LEAVES_STATE_NOT_READY)


class BootIn(In):
    model_config = ConfigDict(json_schema_extra=_boot_schema)

    boot_id: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    config_hash: Annotated[StrictStr, Field(min_length=1, max_length=100)]
    code_version: Annotated[StrictStr, Field(min_length=1, max_length=100)]
    state_schema_version: Annotated[StrictInt, Field(ge=1, le=32767), WHOLE]
    credential_version: Annotated[StrictInt, Field(ge=1, le=2**31 - 1), WHOLE] | None = None
    pid: Annotated[StrictInt, Field(ge=1, le=2**31 - 1), WHOLE]
    host: Annotated[StrictStr, Field(min_length=1, max_length=200)]
    readiness: Readiness
    error: BootError | None = None


class BootOut(Schema):
    boot_id: str
    phase: str
    failed_domains: list[str]
    # Wait this long before starting work (min(300, 2^n) s in a restart episode).
    delay_s: int
    episode_boot: int
    quarantined: bool
    worker_status: str
    # Why lease acquisition is refused after this boot ("" when admitted): NOT_READY,
    # CREDENTIALS_NOT_READY, or RECONCILE_FIRST (ready, but admission is paused until the
    # unknown_left effects this worker left in doubt are decided).
    not_ready_code: str
    unknown_left: int


class WorkerOut(Schema):
    name: str
    status: str
    drain_deadline: datetime | None
    last_heartbeat_at: datetime | None
    # While DRAINING: the sends it dispatched that the provider still reports DEFERRED.
    deliveries_pending: int | None


class ResourceIn(In):
    fencing_token: Token
    kind: Annotated[ResourceKind, Field(strict=False)]  # one of the values; nothing is coerced into one
    provider: Annotated[
        StrictStr,
        Field(min_length=1, max_length=length(RunResource, "provider"), pattern=resources.PROVIDER.pattern),
    ]
    handle: Annotated[StrictStr, Field(min_length=1, max_length=resources.MAX_HANDLE_LENGTH)]
    # Lifetime (default and cap: the policy's quotas.resource_max_age_s) and idle deadline
    # (closed once the run made no progress for this long); both at most the cap.
    ttl_s: Annotated[StrictInt, Field(ge=1, le=2**31 - 1), WHOLE] | None = None
    idle_s: Annotated[StrictInt, Field(ge=1, le=2**31 - 1), WHOLE] | None = None


class ResourceOut(Schema):
    resource_id: str
    run_id: str
    kind: str
    provider: str
    handle: str
    state: str
    created_at: datetime
    expires_at: datetime
    idle_s: int | None
    release_requested_at: datetime | None
    released_at: datetime | None
    attempts: int
    last_error: str


class LeaseReleasedOut(Schema):
    released: bool


class OperationIn(In):
    fencing_token: Token
    tool: Name
    action: Name
    resource: Resource
    # Optional where the tenant's tool contract gives the class; a different one: 422 EFFECT_CLASS_MISMATCH.
    effect_class: EffectClassName | None = None
    idempotency_key: Annotated[StrictStr, Field(min_length=1, max_length=length(Operation, "idempotency_key"))]
    args_digest: Annotated[
        StrictStr, Field(max_length=length(Operation, "args_digest"), pattern=r"^[A-Za-z0-9:_\-]*$")
    ] = ""
    provider: Annotated[StrictStr, Field(max_length=length(Operation, "provider"))] = ""
    estimated_cost_cents: EstimatedCents | None = None
    payload_bytes: Annotated[StrictInt, bounds(Operation, "payload_bytes", ge=0), WHOLE] | None = None
    # The flow-control key of the policy's "key:<flow_key>" / "key:*" limits ('' for none).
    flow_key: Annotated[
        StrictStr, Field(max_length=length(Operation, "flow_key"), pattern=r"^[A-Za-z0-9._:@/\-]*$")
    ] = ""


class OperationCreatedOut(Schema):
    operation_id: str
    phase: Phase
    schema_version: int  # of the operation record (a client refuses one it does not read)


class EffectIn(OperationIn):
    """The intent of ``POST /runs/{run_id}/operations``, the credential lease authorize names,
    and the operation record versions the caller reads: a record at another version is
    answered as intended, and neither authorized nor dispatched (the caller refuses it)."""

    credential_lease_id: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    reads_schema_versions: (
        Annotated[
            list[Annotated[StrictInt, bounds(Operation, "schema_version", ge=1), WHOLE]],
            Field(min_length=1, max_length=16),
        ]
        | None
    ) = None


class LeversOut(Schema):
    """What the tenant's policy hands the worker while its cost breaker is THROTTLED or
    DEGRADED (policy ``breaker.levers``): hold output to ``max_output_tokens`` (null: no
    ceiling) and prefer ``fallbacks``, best first (e.g. cheaper model names)."""

    state: Literal["THROTTLED", "DEGRADED"]
    max_output_tokens: int | None
    fallbacks: list[str]


class DispatchOut(Schema):
    phase: Phase
    # The cost reservation this dispatch made for the attempt (null: nothing was reserved).
    reservation_id: str | None = None
    # The breaker's levers as this dispatch left it (null: NORMAL, or none set for its state).
    levers: LeversOut | None = None


class EffectOut(Schema):
    operation_id: str
    phase: Phase  # DISPATCHED: call the provider; PENDING_APPROVAL: wait for approval_id; else decided before
    attempt: int
    schema_version: int  # of the operation record (a client refuses one it does not read)
    approval_id: str | None  # the approval a person must decide (202), else null
    # This call dispatched it; false for a DISPATCHED an earlier call left without an outcome
    dispatched: bool
    # When this call dispatched: the reservation it made and the breaker's levers (see DispatchOut).
    reservation_id: str | None = None
    levers: LeversOut | None = None


class ProviderRefIn(In):
    # The provider's record of the effect (schema_version 2 of an operation): its id, and
    # the provider it is at (the operation's own provider when left out; another is 422).
    provider: Annotated[StrictStr, Field(min_length=1, max_length=length(Operation, "provider"))] | None = None
    id: ProviderRequestId


class ProviderRefOut(Schema):
    provider: str
    id: str


DeliveryStatusName = Literal["DELIVERED", "BOUNCED", "DEFERRED"]


class DeliveryIn(In):
    """A delivery report (docs/api.md, "Delivery evidence"); occurred_at is ISO 8601 with a zone."""

    fencing_token: Token
    status: DeliveryStatusName
    message_id: Annotated[StrictStr, Field(max_length=300)] = ""
    provider_event_id: Annotated[StrictStr, Field(min_length=1, max_length=200)]
    occurred_at: Annotated[StrictStr, Field(min_length=1, max_length=64, json_schema_extra={"format": "date-time"})]


class DeliveryOut(Schema):
    """An attempt's delivery state: ``status`` as the rules left it."""

    attempt: int
    status: DeliveryStatusName
    message_id: str
    occurred_at: datetime
    updated_at: datetime


class DeliveryRecordedOut(Schema):
    """The answer to a delivery report: the record (``applied``: whether it moved the state;
    ``replayed``: the same provider_event_id was recorded before) and the state now."""

    operation_id: str
    status: DeliveryStatusName
    applied: bool
    replayed: bool
    seq: int
    delivery: DeliveryOut


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
    reconciler: str
    # The W3C trace id of the call that recorded the intent ('' when it sent no traceparent).
    trace_id: str
    flow_key: str
    phase: Phase
    attempt: int
    fencing_token: int | None
    dispatched_at: datetime | None
    # The record's shape (1: provider_request_id only; 2: provider_ref); a client that does
    # not know the version refuses the record rather than guess (docs/api.md "Versions").
    schema_version: int
    provider_request_id: str
    provider_ref: ProviderRefOut | None
    error_code: str
    estimated_cost_cents: int | None
    actual_cost_cents: int | None
    created_at: datetime
    updated_at: datetime
    # The delivery evidence of the current attempt (None: nothing recorded).
    delivery: DeliveryOut | None


class TokenIn(In):
    fencing_token: Token


class AuthorizeIn(In):
    fencing_token: Token
    credential_lease_id: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None


class AuthorizedOut(Schema):
    decision: Literal["ALLOW"]
    phase: Phase


class PhaseOut(Schema):
    phase: Phase


class OutcomeIn(In):
    fencing_token: Token
    outcome: OutcomeName
    # The old form of the provider's record; may be sent with provider_ref when it names the same id.
    provider_request_id: ProviderRequestId | None = None
    provider_ref: ProviderRefIn | None = None
    actual_cost_cents: ActualCents | None = None
    error_code: Code | None = None
    # The worker used one of the breaker's fallbacks (dispatch's levers) for this attempt.
    fallback_used: StrictBool | None = None


class RetryDecisionOut(Schema):
    decision: Literal["STOP", "RETRY", "RETRY_SAME_KEY", "RECONCILE", "APPROVAL"]
    reason: str
    phase: Phase
    attempt: int
    effect_class: EffectClass


class EventIn(In):
    fencing_token: Token
    type: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=WORKER_EVENT_TYPE.pattern)]
    # At most 16 KB as compact JSON; storable (ledger/storable.py); no credential (ledger/boundary/).
    # The published schema says so: EVENT_FIELDS (set by ledger.api.FencelineAPI).
    fields: dict[str, Any]
    # The diagnostic plane (ledger/services/evidence/planes.py): EVENT_PAYLOAD.
    payload: dict[str, Any] | None = None
    # user_content: refused unless the tenant opted in; then stored encrypted.
    payload_class: Literal["event_payload", "user_content"] = "event_payload"


class EventAppendedOut(Schema):
    seq: int
    hash: str


class FenceCheckIn(In):
    run_id: RunId
    fencing_token: Token


class FenceCheckOut(Schema):
    valid: bool


# A lease scope is exact: no wildcard (those belong to policy rules).
ExactScope = Field(pattern="^[^*\\u0000]*$")


class CredentialLeaseIn(In):
    fencing_token: Token
    principal: Annotated[
        StrictStr,
        Field(min_length=1, max_length=length(Credential, "principal"), pattern=f"^{credentials.PRINCIPAL.pattern}$"),
    ]
    actions: Annotated[
        list[Annotated[StrictStr, Field(min_length=1, max_length=credential_leases.MAX_ACTION_LENGTH), ExactScope]],
        Field(min_length=1, max_length=credential_leases.MAX_LEASE_ACTIONS),
    ]
    resources: Annotated[
        list[Annotated[StrictStr, Field(min_length=1, max_length=credential_leases.MAX_RESOURCE_LENGTH), ExactScope]],
        Field(min_length=1, max_length=credential_leases.MAX_LEASE_RESOURCES),
    ]
    # Longer than the tenant policy's max_ttl_s: 403 DENY_POLICY (the policy's decision).
    ttl_s: Annotated[StrictInt, Field(ge=1, le=credential_leases.MAX_LEASE_TTL_S), WHOLE]


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
    resources: Annotated[list[Resource], Field(min_length=1, max_length=50)]
    max_calls: Annotated[StrictInt, bounds(CapabilityBudget, "max_calls", ge=1), WHOLE]
    max_bytes: Annotated[StrictInt, bounds(CapabilityBudget, "max_bytes", ge=1), WHOLE] | None = None
    ttl_s: Ttl
    approval: Literal["none", "human"] = "none"


class CapabilityOut(Schema):
    capability_id: str
    status: str
    approval_id: str | None = None


class RetryOut(Schema):
    attempt: int
    phase: Phase


class ChainHeadOut(Schema):
    last_seq: int
    last_hash: str


class ExportedEventOut(Schema):
    """Every field of the canonical form (ledger/chain.py), the event's hash, and its MAC."""

    run_id: str
    seq: int
    event_id: str
    type: str
    schema_version: int
    actor: str
    occurred_at: str  # UTC, ISO-8601 with microseconds and a trailing Z, as hashed
    fields: dict[str, Any]
    prev_hash: str
    hash: str
    # The id of the event key and "hmac-sha256:" + hex HMAC-SHA256 of canonical JSON
    # {run_id, seq, hash, key_id}; both empty on events written before MACs existed.
    mac_key_id: str
    mac: str
    # Schema version 2 only, outside the canonical form: the diagnostic payload its fields
    # commit to by digest, or that retention removed it ({"by": "retention", "at"}).
    payload: dict[str, Any] | None = None
    payload_removed: dict[str, Any] | None = None


class ExportedCheckpointOut(Schema):
    run_id: str
    seq: int
    last_hash: str
    verifier_version: str
    key_id: str
    mac: str


class ChainExportOut(Schema):
    run_id: str
    head: ChainHeadOut
    events: list[ExportedEventOut]
    checkpoints: list[ExportedCheckpointOut]
