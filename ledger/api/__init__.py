"""Worker API v1. Views are thin: parse, call one service, shape the response."""

import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.utils import timezone
from ninja import NinjaAPI, Status
from ninja.openapi.schema import OpenAPISchema

from ledger import selectors
from ledger.api import errors
from ledger.api.auth import WorkerBearer, WorkerRequest
from ledger.api.body import StrictJSONParser
from ledger.api.schemas import (
    STORABLE_JSON,
    STORABLE_OBJECT_PROPERTIES,
    ApprovalRequiredOut,
    AuthorizedOut,
    AuthorizeIn,
    BootIn,
    BootOut,
    CancelIn,
    CancelledOut,
    CapabilityIn,
    CapabilityOut,
    ChainExportOut,
    CheckpointIn,
    CheckpointSavedOut,
    CredentialLeaseIn,
    CredentialLeaseOut,
    DecisionError,
    DeliveryIn,
    DeliveryRecordedOut,
    DispatchOut,
    DrainIn,
    EffectIn,
    EffectOut,
    Error,
    EventAppendedOut,
    EventIn,
    FenceCheckIn,
    FenceCheckOut,
    InvalidOut,
    LeaseAcquireIn,
    LeaseGrantedOut,
    LeaseLostError,
    LeaseReleasedOut,
    LeaseReleaseIn,
    LeaseRenewedOut,
    LeaseRenewIn,
    OperationCreatedOut,
    OperationIn,
    OperationOut,
    OutcomeIn,
    PhaseError,
    PhaseOut,
    ResourceIn,
    ResourceOut,
    RetryDecisionOut,
    RetryOut,
    RunCreatedOut,
    RunCreateIn,
    RunOut,
    ThrottledError,
    TokenIn,
    WorkerOut,
)
from ledger.models import EffectDelivery, Operation, ProgressCheckpoint, Run, RunResource, Worker
from ledger.services.authority import capabilities, credential_leases
from ledger.services.authority.breaker import Levers
from ledger.services.core.fencing import fence_check
from ledger.services.core.handoff import queues
from ledger.services.core.intent import Intent
from ledger.services.delivery import record as delivery
from ledger.services.delivery.lookup import deliveries_pending
from ledger.services.delivery.webhooks import delivery_webhook_receive
from ledger.services.evidence.append import phase_count_field
from ledger.services.evidence.export import chain_export
from ledger.services.fence import deliveries, effects, ending, leases, notes, operations, outcomes, retry, runs
from ledger.services.fleet import boots, lifecycle
from ledger.services.fleet.stale_tokens import DIRECTIVE_HEADER, directive_for
from ledger.services.lifespan import checkpoints, resources
from ledger.states import Outcome, Phase

DESCRIPTION = """
Fenceline's worker API. Authenticate with `Authorization: Bearer <worker token>`; the
tenant comes from the token. Every refusal is `{"error": CODE, "detail": "..."}`.

`authorize` and `dispatch` decide under the tenant's current policy version: credential
lease, policy, capability budget, cost breaker and human approval, in that order; `dispatch`
repeats every check and reserves one capability call and the worst-case cost. A new tenant
starts on the starter policy: any tool, approval none, TTL up to 3600 s, up to 100 calls,
no credential required, no cost limit.
"""


# A response body as a view builds it: JSON that ninja validates against the endpoint's
# response schema (ledger/api/schemas.py) before it is sent.
type Body = dict[str, object]


# The ids one answer gives and other calls take in their path: OpenAPI links say so, and a
# client generator or schemathesis' stateful phase follows them (create a run, then lease it).
LINKED_IDS = ("run_id", "operation_id", "resource_id", "approval_id")


def _link_ids(document: OpenAPISchema) -> None:
    """Every successful answer that carries one of LINKED_IDS links to each call whose path
    takes it (``$response.body#/run_id`` -> ``/runs/{run_id}/...``)."""
    components = document["components"]["schemas"]
    takers = {
        name: [(op["operationId"], path) for path, ops in document["paths"].items() for op in ops.values()]
        for name in LINKED_IDS
    }
    for ops in document["paths"].values():
        for op in ops.values():
            for status, answer in op["responses"].items():
                ref = answer.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref", "")
                properties = components.get(ref.rsplit("/", 1)[-1], {}).get("properties", {})
                if not 200 <= int(status) < 300 or not properties:
                    continue
                links = {
                    f"{target}.{name}": {"operationId": target, "parameters": {name: f"$response.body#/{name}"}}
                    for name in LINKED_IDS
                    if name in properties
                    for target, path in takers[name]
                    if "{" + name + "}" in path
                }
                if links:
                    answer["links"] = links


class FencelineAPI(NinjaAPI):
    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None
    ) -> OpenAPISchema:
        """Ninja's schema, with event fields described as storable JSON (a recursive component
        pydantic cannot write for ``dict[str, Any]``)."""
        document = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        components = document["components"]["schemas"]
        components["StorableJSON"] = STORABLE_JSON
        for (component, name), schema in STORABLE_OBJECT_PROPERTIES.items():
            components[component]["properties"][name] = schema
        _link_ids(document)
        return document

    def create_response(
        self,
        request: HttpRequest,
        data: Any,
        *,
        status: int | None = None,
        temporal_response: HttpResponse | None = None,
    ) -> HttpResponse:
        """Every response (answer or refusal) to a QUARANTINED worker tells it to stop."""
        response = super().create_response(request, data, status=status, temporal_response=temporal_response)
        directive = directive_for(getattr(request, "worker", None))
        if directive:
            response[DIRECTIVE_HEADER] = directive
        return response


api = FencelineAPI(
    title="Fenceline worker API",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api-v1",
    auth=WorkerBearer(),
    parser=StrictJSONParser(),
)
errors.install(api)

E = Error
# Every endpoint answers 401 without a valid worker token (429 past too many failed tokens from
# one address, ledger/services/fleet/token_failures.py), 422 for a URL that carries a
# credential-like value (console/middleware.py) and 503 DATABASE_UNAVAILABLE (with Retry-After)
# while the database cannot be reached. A body is refused with 400 (empty, or not one
# unambiguous JSON object), 413 (over DATA_UPLOAD_MAX_MEMORY_SIZE) or 422 (naming the field;
# nested deeper than JSON_MAX_DEPTH).
READ = {401: E, 422: InvalidOut, 429: ThrottledError, 503: E}
BODY = {400: E, 401: E, 413: E, 422: InvalidOut, 429: ThrottledError, 503: E}


def _run_out(run: Run) -> Body:
    """The run with its four indicators and its liveness (the time its outcomes spent in
    UNKNOWN comes from its cases, through the people's queues: ``core.handoff``)."""
    lease = run.lease
    now = timezone.now()
    return {
        "run_id": str(run.pk),
        "external_id": run.external_id,
        "status": run.status,
        "schema_version": run.schema_version,
        "created_at": run.created_at,
        "lease": {
            "owner_id": lease.owner_id,
            "fencing_token": lease.fencing_token,
            "expires_at": lease.expires_at,
            "last_renewed_at": lease.last_renewed_at,
        },
        "chain": {"last_seq": run.last_seq, "last_hash": run.last_hash},
        "stale_rejections": run.stale_rejections,
        "operations": {phase: getattr(run, phase_count_field(phase)) for phase in Phase.values},
        "indicators": selectors.run_indicators(run),
        "deadline_at": run.deadline_at,
        "cancel": _cancel_out(run),
        "liveness": selectors.run_liveness(run=run, unknown=queues().run_unknown_time(run=run, now=now), now=now),
    }


def _cancel_out(run: Run) -> Body | None:
    if not run.ending:
        return None
    return {
        "run_status": run.status,
        "ending": run.ending,
        "reason": run.cancel_reason,
        "requested_by": run.cancel_requested_by,
        "requested_at": run.cancel_requested_at,
        "grace_until": run.cancel_grace_until,
    }


def _resource_out(resource: RunResource) -> Body:
    return {
        "resource_id": str(resource.pk),
        "run_id": str(resource.run_id),
        **{
            name: getattr(resource, name)
            for name in (
                "kind",
                "provider",
                "handle",
                "state",
                "created_at",
                "expires_at",
                "idle_s",
                "release_requested_at",
                "released_at",
                "attempts",
                "last_error",
            )
        },
    }


def _op_out(op: Operation) -> Body:
    return {
        "operation_id": str(op.pk),
        "run_id": str(op.run_id),
        **{
            name: getattr(op, name)
            for name in (
                "tool",
                "action",
                "resource",
                "effect_class",
                "idempotency_key",
                "args_digest",
                "provider",
                "reconciler",
                "trace_id",
                "flow_key",
                "phase",
                "attempt",
                "fencing_token",
                "dispatched_at",
                "schema_version",
                "provider_request_id",
                "provider_ref",
                "error_code",
                "estimated_cost_cents",
                "actual_cost_cents",
                "created_at",
                "updated_at",
            )
        },
        "delivery": _delivery_out(selectors.operation_delivery(operation=op)),
    }


def _delivery_out(found: EffectDelivery | None) -> Body | None:
    if found is None:
        return None
    return {
        "attempt": found.attempt,
        "status": found.state,
        "message_id": found.message_id,
        "occurred_at": found.occurred_at,
        "updated_at": found.updated_at,
    }


# --- runs and leases ------------------------------------------------------------------


@api.post(
    "/runs",
    response={201: RunCreatedOut, 200: RunCreatedOut, **BODY, 403: DecisionError, 404: E, 409: E},
    tags=["runs"],
)
def create_run(request: WorkerRequest, body: RunCreateIn) -> Status[Body]:
    """Create a run. The same external_id returns the existing run with 200. A
    max_runtime_s above the policy's is 403 DENY_POLICY naming the field."""
    run, created = runs.run_create(
        worker=request.worker,
        schema_version=body.schema_version,
        external_id=body.external_id,
        parent_run_id=body.parent_run_id,
        max_runtime_s=body.max_runtime_s,
    )
    return Status(201 if created else 200, {"run_id": str(run.pk), "status": run.status})


@api.get("/runs/{run_id}", response={200: RunOut, **READ, 404: E}, tags=["runs"])
def get_run(request: WorkerRequest, run_id: str) -> Body:
    return _run_out(selectors.run_get(tenant=request.worker.tenant, run_id=run_id))


@api.post(
    "/runs/{run_id}/lease",
    response={200: LeaseGrantedOut, **BODY, 403: DecisionError, 404: E, 409: E},
    tags=["leases"],
)
def acquire_lease(request: WorkerRequest, run_id: str, body: LeaseAcquireIn) -> Body:
    """Take the run's lease — a new instance of the run, under the tenant's instance quotas —
    with the run's latest progress checkpoint to resume from.
    403 DENY_QUOTA (naming quota, limit and use) when an instance quota is full;
    409 LEASE_HELD while another owner holds an unexpired lease;
    409 WORKER_NOT_ACCEPTING for a worker that is draining, stopped or quarantined;
    409 NOT_READY for a worker whose last boot is not ready, or with "missing": "boot_report"
    for one that sent no boot report under a policy with admission.boot_report_required;
    409 RUN_CANCELLED for a cancelled or timed-out run, 409 RUN_COMPLETED for a completed one."""
    lease = leases.lease_acquire(
        worker=request.worker, run_id=run_id, owner_id=body.owner_id, ttl_s=body.ttl_s, tool=body.tool or ""
    )
    latest = selectors.run_latest_checkpoint(run=lease.run)
    return {
        "fencing_token": lease.fencing_token,
        "expires_at": lease.expires_at,
        "checkpoint": _checkpoint_out(latest) if latest else None,
    }


def _checkpoint_out(checkpoint: ProgressCheckpoint) -> Body:
    return {
        "checkpoint_id": str(checkpoint.pk),
        "seq": checkpoint.seq,
        "position": checkpoint.position,
        "state": checkpoint.state,
        "digest": checkpoint.digest,
        "created_at": checkpoint.created_at,
    }


@api.post(
    "/runs/{run_id}/checkpoints",
    response={201: CheckpointSavedOut, **BODY, 404: E, 409: E},
    tags=["runs"],
)
def save_checkpoint(request: WorkerRequest, run_id: str, body: CheckpointIn) -> Status[Body]:
    """Save where the run's work stands (state: a JSON object of at most 64 KB), under the
    fence. Whoever takes the lease next gets the latest checkpoint with it and resumes."""
    checkpoint = checkpoints.checkpoint_save(
        worker=request.worker,
        run_id=run_id,
        fencing_token=body.fencing_token,
        position=body.position,
        state=body.state,
    )
    return Status(201, {"checkpoint_id": str(checkpoint.pk), "seq": checkpoint.seq, "digest": checkpoint.digest})


@api.post(
    "/runs/{run_id}/lease/renew",
    response={200: LeaseRenewedOut, **BODY, 404: E, 409: LeaseLostError | Error},
    tags=["leases"],
)
def renew_lease(request: WorkerRequest, run_id: str, body: LeaseRenewIn) -> Body:
    """Extend the lease: the worker's heartbeat. 409 LEASE_LOST with reason owner_changed,
    token_changed, released, expired or idle (no progress for the policy's idle_limit_s).
    A cancelled or timed-out run still renews during its grace, with `cancel` set (stop new
    work, report what is in flight, release); once it has ended, 409 RUN_CANCELLED."""
    lease = leases.lease_renew(
        worker=request.worker, run_id=run_id, owner_id=body.owner_id, fencing_token=body.fencing_token, ttl_s=body.ttl_s
    )
    return {"expires_at": lease.expires_at, "run_status": lease.run.status, "cancel": _cancel_out(lease.run)}


@api.post(
    "/runs/{run_id}/cancel",
    response={200: CancelledOut, **BODY, 403: E, 404: E, 409: E},
    tags=["runs"],
)
def cancel_run(request: WorkerRequest, run_id: str, body: CancelIn) -> Body:
    """Cancel the run and its children, by the worker holding its lease or its parent's
    (403 otherwise). CANCELLING at once; CANCELLED once nothing is DISPATCHED, or when the
    policy's cancel_grace_s is over (what is still DISPATCHED then becomes UNKNOWN with a
    case). New intents, authorizations, dispatches and retries answer 409 RUN_CANCELLED.
    Cancelling again changes nothing; a completed or timed-out run: 409."""
    run = ending.run_cancel(
        tenant=request.worker.tenant, run_id=run_id, reason=body.reason, actor="", worker=request.worker
    )
    return {"run_id": str(run.pk), "status": run.status, "cancel": _cancel_out(run)}


@api.post(
    "/runs/{run_id}/lease/release",
    response={200: LeaseReleasedOut, **BODY, 404: E, 409: LeaseLostError},
    tags=["leases"],
)
def release_lease(request: WorkerRequest, run_id: str, body: LeaseReleaseIn) -> Body:
    leases.lease_release(worker=request.worker, run_id=run_id, owner_id=body.owner_id, fencing_token=body.fencing_token)
    return {"released": True}


@api.post(
    "/runs/{run_id}/complete",
    response={200: RunCreatedOut, **BODY, 404: E, 409: E},
    tags=["runs"],
)
def complete_run(request: WorkerRequest, run_id: str, body: TokenIn) -> Body:
    """The run's terminal transition, by the lease owner. The lease ends; effects still in
    flight become UNKNOWN with a reconciliation case; the verifier seals the chain."""
    run = runs.run_complete(worker=request.worker, run_id=run_id, fencing_token=body.fencing_token)
    return {"run_id": str(run.pk), "status": run.status}


# --- operations -------------------------------------------------------------------------


@api.post(
    "/runs/{run_id}/operations",
    response={201: OperationCreatedOut, 200: OperationCreatedOut, **BODY, 403: E, 404: E, 409: E},
    tags=["operations"],
)
def create_operation(request: WorkerRequest, run_id: str, body: OperationIn) -> Status[Body]:
    """Record the intent of a side effect. Replaying the same idempotency_key with the same
    parameters returns the same operation (200); other parameters: 422 IDEMPOTENCY_MISMATCH.
    The side-effect class comes from the tenant's tool contract: a different declared one is
    422 EFFECT_CLASS_MISMATCH; a tool without a contract under a policy that refuses those is
    403 DENY_POLICY."""
    intent = Intent(**body.model_dump(exclude={"fencing_token"}))
    op, created = operations.operation_intend(
        worker=request.worker, run_id=run_id, fencing_token=body.fencing_token, intent=intent
    )
    return Status(
        201 if created else 200, {"operation_id": str(op.pk), "phase": op.phase, "schema_version": op.schema_version}
    )


@api.get("/operations/{operation_id}", response={200: OperationOut, **READ, 404: E}, tags=["operations"])
def get_operation(request: WorkerRequest, operation_id: str) -> Body:
    return _op_out(selectors.operation_get(tenant=request.worker.tenant, operation_id=operation_id))


@api.post(
    "/operations/{operation_id}/authorize",
    response={
        200: AuthorizedOut,
        202: ApprovalRequiredOut,
        **BODY,
        403: DecisionError,
        404: E,
        409: PhaseError | Error,
    },
    tags=["operations"],
)
def authorize_operation(request: WorkerRequest, operation_id: str, body: AuthorizeIn) -> Body:
    """Decide under the tenant's current policy: the credential lease (if named or required),
    the policy, the run's capability, the cost breaker, and a person's approval where the
    policy asks for one. 403 carries the DENY_* code in `error` and `decision`."""
    op = operations.operation_authorize(
        worker=request.worker,
        operation_id=operation_id,
        fencing_token=body.fencing_token,
        credential_lease_id=body.credential_lease_id,
    )
    return {"decision": "ALLOW", "phase": op.phase}


@api.post(
    "/operations/{operation_id}/dispatch",
    response={200: DispatchOut, **BODY, 403: DecisionError, 404: E, 409: PhaseError | Error},
    tags=["operations"],
)
def dispatch_operation(request: WorkerRequest, operation_id: str, body: TokenIn) -> Body:
    """AUTHORIZED -> DISPATCHED after every check of authorize passes again under the current
    policy, and one capability call and the worst-case cost are reserved. Only after a 200
    here may the worker call the provider. 403 when authorization no longer holds. The answer
    carries the cost reservation made (`reservation_id`) and, while the tenant's cost breaker
    is THROTTLED or DEGRADED, the policy's `levers`: an output ceiling and fallbacks."""
    dispatched = operations.operation_dispatch_terms(
        worker=request.worker, operation_id=operation_id, fencing_token=body.fencing_token
    )
    return {"phase": dispatched.operation.phase, **_terms(dispatched.reservation_id, dispatched.levers)}


def _terms(reservation_id: uuid.UUID | None, levers: Levers | None) -> dict[str, object]:
    """A dispatch's reservation id and the breaker's levers, as the answers carry them."""
    return {
        "reservation_id": str(reservation_id) if reservation_id else None,
        "levers": {
            "state": levers.state,
            "max_output_tokens": levers.max_output_tokens,
            "fallbacks": list(levers.fallbacks),
        }
        if levers
        else None,
    }


@api.post(
    "/runs/{run_id}/effects",
    response={
        201: EffectOut,
        200: EffectOut,
        202: EffectOut,
        **BODY,
        403: DecisionError,
        404: E,
        409: PhaseError | Error,
    },
    tags=["operations"],
)
def start_effect(request: WorkerRequest, run_id: str, body: EffectIn) -> Status[Body]:
    """Intent, authorize and dispatch in one call, as far as nothing waits for a person: the
    body of `POST /runs/{run_id}/operations` and authorize's optional credential_lease_id.
    201 for a new intent, 200 for a replay of its idempotency_key; `phase` DISPATCHED: call
    the provider now, then report the outcome. 202 with `approval_id` when a person must
    approve first (the operation is PENDING_APPROVAL; the same call again once approved
    dispatches). A replay of an operation past AUTHORIZED answers its phase and dispatches
    nothing again; `dispatched` says whether this call dispatched it (false for a DISPATCHED
    an earlier call left without an outcome: whether that effect happened is not known).
    Every refusal is the one the separate calls give (409 STALE_TOKEN, 403
    DENY_*, 409 EFFECTS_HELD, 422 IDEMPOTENCY_MISMATCH ...), with the steps before it kept.
    With reads_schema_versions, an operation record at another version is answered as
    intended and taken no further."""
    started = effects.operation_start(
        worker=request.worker,
        run_id=run_id,
        fencing_token=body.fencing_token,
        intent=Intent(**body.model_dump(exclude={"fencing_token", "credential_lease_id", "reads_schema_versions"})),
        credential_lease_id=body.credential_lease_id,
        reads=body.reads_schema_versions,
    )
    op = started.operation
    return Status(
        202 if started.approval_id else 201 if started.created else 200,
        {
            "operation_id": str(op.pk),
            "phase": started.phase,
            "attempt": op.attempt,
            "schema_version": op.schema_version,
            "approval_id": str(started.approval_id) if started.approval_id else None,
            "dispatched": started.dispatched,
            **_terms(started.reservation_id, started.levers),
        },
    )


@api.post(
    "/operations/{operation_id}/retry",
    response={
        200: RetryOut,
        202: ApprovalRequiredOut,
        **BODY,
        403: DecisionError,
        404: E,
        409: PhaseError | Error,
    },
    tags=["operations"],
)
def retry_operation(request: WorkerRequest, operation_id: str, body: TokenIn) -> Body:
    """Start the next attempt as the retry decision allows. 409 RECONCILE_FIRST while the
    outcome is UNKNOWN; 202 APPROVAL_REQUIRED for an operation that needs a person; 409
    ALREADY_DELIVERED for a NON_RETRYABLE send whose delivery is recorded DELIVERED or
    DEFERRED. Every refusal of the decision leaves a RETRY_REFUSED event in the chain."""
    op = retry.operation_retry(worker=request.worker, operation_id=operation_id, fencing_token=body.fencing_token)
    return {"attempt": op.attempt, "phase": op.phase}


@api.post(
    "/runs/{run_id}/capabilities",
    response={201: CapabilityOut, **BODY, 403: DecisionError, 404: E, 409: E},
    tags=["authority"],
)
def request_capability(request: WorkerRequest, run_id: str, body: CapabilityIn) -> Status[Body]:
    """A capability budget for one tool on this run: ACTIVE, or PENDING_APPROVAL when
    approval is `human` (or the policy puts the tool before a person)."""
    requested = capabilities.capability_request(worker=request.worker, run_id=run_id, **body.model_dump())
    approval = requested.approval
    return Status(
        201,
        {
            "capability_id": str(requested.capability.pk),
            "status": requested.capability.status,
            "approval_id": str(approval.pk) if approval else None,
        },
    )


@api.post(
    "/operations/{operation_id}/outcome",
    response={200: PhaseOut, **BODY, 404: E, 409: PhaseError | Error},
    tags=["operations"],
)
def report_outcome(request: WorkerRequest, operation_id: str, body: OutcomeIn) -> Body:
    """Report CONFIRMED, FAILED or UNKNOWN for a DISPATCHED operation. UNKNOWN opens a
    reconciliation case. A report under a fenced token is refused (409 STALE_TOKEN); its
    provider_request_id is kept on the case as unverified evidence."""
    op = outcomes.operation_report_outcome(
        worker=request.worker,
        operation_id=operation_id,
        fencing_token=body.fencing_token,
        outcome=Outcome(body.outcome),
        provider_request_id=body.provider_request_id or "",
        actual_cost_cents=body.actual_cost_cents,
        error_code=body.error_code or "",
        provider_ref=body.provider_ref.dict(exclude_none=True) if body.provider_ref is not None else None,
        fallback_used=body.fallback_used,
    )
    return {"phase": op.phase}


@api.post(
    "/operations/{operation_id}/deliveries",
    response={201: DeliveryRecordedOut, 200: DeliveryRecordedOut, **BODY, 404: E, 409: PhaseError | Error},
    tags=["operations"],
)
def record_delivery(request: WorkerRequest, operation_id: str, body: DeliveryIn) -> Status[Body]:
    """Record delivery evidence of the operation's current attempt (DELIVERED, BOUNCED or
    DEFERRED), apart from its outcome, by the worker holding the run's lease: a
    DELIVERY_RECORDED event in the run's chain. DEFERRED -> DELIVERED | BOUNCED; DELIVERED
    and BOUNCED are final (a later record is kept, applied false). The same
    provider_event_id again answers 200 as the first time; with other content 422
    IDEMPOTENCY_MISMATCH. Never dispatched: 409 WRONG_PHASE; a stale token: 409 STALE_TOKEN."""
    report = delivery.report_checked(
        state=body.status,
        message_id=body.message_id,
        provider_event_id=body.provider_event_id,
        occurred_at=delivery.occurred_at_parsed(body.occurred_at),
    )
    recorded = deliveries.delivery_record(
        worker=request.worker, operation_id=operation_id, fencing_token=body.fencing_token, report=report
    )
    return Status(200 if recorded.replayed else 201, _recorded_out(recorded))


def _recorded_out(recorded: delivery.Recorded) -> Body:
    record = recorded.record
    return {
        "operation_id": str(record.operation_id),
        "status": record.state,
        "applied": record.applied,
        "replayed": recorded.replayed,
        "seq": record.seq,
        "delivery": _delivery_out(recorded.delivery),
    }


@api.post(
    "/webhooks/deliveries/{source}",
    auth=None,
    response={
        201: DeliveryRecordedOut,
        200: DeliveryRecordedOut,
        400: E,
        401: E,
        404: E,
        409: PhaseError | Error,
        413: E,
        422: InvalidOut,
        503: E,
    },
    tags=["webhooks"],
)
def delivery_webhook(request: HttpRequest, source: str) -> Status[Body]:
    """A provider's signed delivery webhook (no worker token: the signature under the
    source's secret is the credential; FENCELINE_DELIVERY_SOURCES, docs/operations.md).
    Stripe-style (Stripe-Signature, with a tolerance window) or GitHub-style
    (X-Hub-Signature-256). A missing, wrong or stale signature: 401 BAD_SIGNATURE, nothing
    written. Recorded as the worker's report is, with the actor provider:<source>."""
    recorded = delivery_webhook_receive(source=source, headers=request.headers, body=request.body)
    return Status(200 if recorded.replayed else 201, _recorded_out(recorded))


@api.get(
    "/operations/{operation_id}/retry-decision",
    response={200: RetryDecisionOut, **READ, 404: E},
    tags=["operations"],
)
def retry_decision(request: WorkerRequest, operation_id: str) -> Body:
    op = selectors.operation_get(tenant=request.worker.tenant, operation_id=operation_id)
    decision, reason = retry.retry_decision_now(op)
    return {
        "decision": decision,
        "reason": reason,
        "phase": op.phase,
        "attempt": op.attempt,
        "effect_class": op.effect_class,
    }


# --- events -----------------------------------------------------------------------------


@api.post(
    "/runs/{run_id}/events",
    response={201: EventAppendedOut, **BODY, 403: InvalidOut, 404: E, 409: E},
    tags=["events"],
)
def append_event(request: WorkerRequest, run_id: str, body: EventIn) -> Status[Body]:
    """Append a NOTE or an ``x.``-prefixed event (fields: a JSON object of at most 16 KB, kept
    in the chain for good; payload: an optional JSON object of at most 64 KB, kept in the
    diagnostic plane for the tenant's retention, the chain committing to its digest)."""
    event = notes.event_append(
        worker=request.worker,
        run_id=run_id,
        fencing_token=body.fencing_token,
        type=body.type,
        fields=body.fields,
        payload=body.payload,
        payload_class=body.payload_class,
    )
    return Status(201, {"seq": event.seq, "hash": event.hash})


@api.get("/runs/{run_id}/events", response={200: ChainExportOut, **READ, 404: E}, tags=["events"])
def export_events(request: WorkerRequest, run_id: str) -> StreamingHttpResponse:
    """The run's chain in seq order, streamed: {"run_id", "head", "events": [...],
    "checkpoints": [...]}; each event has every field of the canonical form plus its hash,
    and its MAC with the id of the event key it is under. Check it anywhere with
    `fenceline-verify EXPORT.json --keys KEYS.json --event-keys EVENT_KEYS.json` (the fenceline-client
    package; or run its standard-library-only file `evidence_verifier.py` with python)."""
    run = selectors.run_get(tenant=request.worker.tenant, run_id=run_id)
    response = StreamingHttpResponse(chain_export(run), content_type="application/json")
    return response


# --- credential leases -----------------------------------------------------------------


@api.post(
    "/runs/{run_id}/credential-leases",
    response={201: CredentialLeaseOut, **BODY, 403: DecisionError, 404: E, 409: E},
    tags=["authority"],
)
def issue_credential_lease(request: WorkerRequest, run_id: str, body: CredentialLeaseIn) -> Status[Body]:
    """Lend the run the principal's current credential version for exactly these actions
    and resources, until now + ttl_s (at most the policy's max_ttl_s). Returns a reference
    to where the secret is kept, never the secret. 403 DENY_POLICY when the tenant policy
    does not allow some action on some resource, or the principal is unknown; 409
    STALE_TOKEN under a fencing token that is not current."""
    lease = credential_leases.credential_lease_issue(worker=request.worker, run_id=run_id, **body.model_dump())
    return Status(
        201,
        {
            "lease_id": str(lease.pk),
            "credential_ref": lease.credential.secret_ref,
            "credential_version": lease.version,
            "expires_at": lease.expires_at,
        },
    )


# --- the worker itself -----------------------------------------------------------------


def _worker_out(worker: Worker) -> Body:
    draining = worker.status == "DRAINING"
    return {
        "name": worker.name,
        "status": worker.status,
        "drain_deadline": worker.drain_deadline,
        "last_heartbeat_at": worker.last_heartbeat_at,
        "deliveries_pending": deliveries_pending(worker_id=worker.pk) if draining else None,
    }


@api.post("/workers/me/drain", response={200: WorkerOut, **BODY, 409: E}, tags=["workers"])
def drain_me(request: WorkerRequest, body: DrainIn) -> Body:
    """The worker drains itself (its SIGTERM handler): no new lease, intent or dispatch from
    now on (409 WORKER_DRAINING); outcomes, checkpoints and resource releases are accepted
    until deadline_s, after which its leases are revoked. Draining again changes nothing."""
    change = lifecycle.worker_drain_self(worker=request.worker, deadline_s=body.deadline_s, reason=body.reason or "")
    return _worker_out(change.worker)


@api.post("/workers/me/boots", response={201: BootOut, 200: BootOut, **BODY, 409: Error}, tags=["workers"])
def report_boot(request: WorkerRequest, body: BootIn) -> Status[Body]:
    """Report a start of the worker process with its readiness per domain (runtime, state,
    credentials, outbound_delivery, admission). A failed domain stops admission: lease
    acquisition answers 409 NOT_READY (CREDENTIALS_NOT_READY when only credentials failed)
    until a ready boot. The answer's delay_s is how long to wait first; past the policy's
    restart_budget the worker is QUARANTINED (quarantined: true) until a person resumes it,
    and so is a boot whose error is a state migration. A ready boot of a worker that left
    effects in doubt is admitted only once they are decided (409 RECONCILE_FIRST). A policy
    with runtime_audit refuses admission to a boot whose container self-audit
    (readiness.runtime.evidence.audit) fails it. The same report again under its boot_id
    (a retry after a lost answer) is answered as the first time, with 200; other content
    under a reported boot_id is 409 BOOT_ID_REUSED."""
    answer = boots.worker_boot(worker=request.worker, report=boots.BootReport(**body.model_dump()))
    boot = answer.boot
    return Status(
        200 if answer.replayed else 201,
        {
            "boot_id": boot.boot_id,
            "phase": boot.phase,
            "failed_domains": boot.failed_domains,
            "delay_s": answer.delay_s,
            "episode_boot": boot.episode_boot,
            "quarantined": answer.quarantined,
            "worker_status": request.worker.status,
            "not_ready_code": request.worker.not_ready_code,
            "unknown_left": boot.unknown_left,
        },
    )


@api.post("/workers/me/heartbeat", response={200: WorkerOut, **BODY}, tags=["workers"])
def heartbeat(request: WorkerRequest) -> Body:
    """The process is alive, apart from any lease it holds. A QUIESCED worker whose heartbeat
    lapses (FENCELINE_WORKER_HEARTBEAT_LAPSE_S, 60 s) is STOPPED."""
    return _worker_out(lifecycle.worker_heartbeat(worker=request.worker))


@api.post("/workers/me/exit", response={200: WorkerOut, **BODY, 409: PhaseError | Error}, tags=["workers"])
def exit_me(request: WorkerRequest) -> Body:
    """The worker is exiting: QUIESCED (or DRAINING with no live lease) -> STOPPED."""
    return _worker_out(lifecycle.worker_exit(worker=request.worker))


# --- resources ------------------------------------------------------------------------


@api.post(
    "/runs/{run_id}/resources",
    response={201: ResourceOut, 200: ResourceOut, **BODY, 403: DecisionError, 404: E, 409: E},
    tags=["resources"],
)
def attach_resource(request: WorkerRequest, run_id: str, body: ResourceIn) -> Status[Body]:
    """Register a resource the run now holds (a browser session, a connection, a sandbox,
    a temporary object, a file) by reference — `handle` is never a secret. The same live
    handle on the same run again answers 200 with it; a handle live in another run (of any
    tenant) 409 RESOURCE_IN_USE; past the policy's resources_per_run quota 403 DENY_QUOTA.
    The resource reaper closes it when the run ends, its lease is lost, or its deadlines pass."""
    resource, created = resources.resource_attach(
        worker=request.worker,
        run_id=run_id,
        fencing_token=body.fencing_token,
        attach=resources.Attach(
            kind=body.kind.value, provider=body.provider, handle=body.handle, ttl_s=body.ttl_s, idle_s=body.idle_s
        ),
    )
    return Status(201 if created else 200, _resource_out(resource))


@api.get("/resources/{resource_id}", response={200: ResourceOut, **READ, 404: E}, tags=["resources"])
def get_resource(request: WorkerRequest, resource_id: str) -> Body:
    return _resource_out(selectors.resource_get(tenant_id=request.worker.tenant_id, resource_id=resource_id))


@api.post(
    "/resources/{resource_id}/release",
    response={200: ResourceOut, **BODY, 404: E, 409: E},
    tags=["resources"],
)
def release_resource(request: WorkerRequest, resource_id: str, body: TokenIn) -> Body:
    """Done with a resource: RELEASE_REQUESTED. The reaper closes it through the driver of
    its kind and marks it RELEASED only once the driver confirms. Asking again changes nothing."""
    resource = resources.resource_release(
        worker=request.worker, resource_id=resource_id, fencing_token=body.fencing_token
    )
    return _resource_out(resource)


@api.post("/fence/check", response={200: FenceCheckOut, **BODY}, tags=["leases"])
def check_fence(request: WorkerRequest, body: FenceCheckIn) -> Body:
    """For downstream systems that enforce the fence themselves: is this the run's current,
    unexpired token? Unknown runs (and other tenants' runs) answer false."""
    return {"valid": fence_check(tenant=request.worker.tenant, run_id=body.run_id, fencing_token=body.fencing_token)}
