"""Worker API v1. Views are thin: parse, call one service, shape the response."""

import json

from django.http import StreamingHttpResponse
from ninja import NinjaAPI, Status
from ninja.parser import Parser

from ledger import selectors
from ledger.api import errors
from ledger.api.auth import WorkerBearer
from ledger.api.schemas import (
    AuthorizedOut,
    AuthorizeIn,
    Error,
    EventAppendedOut,
    EventIn,
    FenceCheckIn,
    FenceCheckOut,
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
    RetryDecisionOut,
    RunCreatedOut,
    RunCreateIn,
    RunOut,
    TokenIn,
)
from ledger.chain import format_time
from ledger.models import Checkpoint, Event
from ledger.services.events import phase_count_field
from ledger.states import Phase
from ledger.services import leases, notes, operations, retry, runs
from ledger.services.fencing import fence_check
from ledger.services.operations import Intent


class StrictJSONParser(Parser):
    def parse_body(self, request):
        try:
            data = json.loads(request.body, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            raise errors.MalformedBody("not JSON") from exc
        if not isinstance(data, dict):
            raise errors.MalformedBody("not a JSON object")
        return data


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not allowed")


DESCRIPTION = """
Fenceline's worker API. Authenticate with `Authorization: Bearer <worker token>`; the
tenant comes from the token. Every refusal is `{"error": CODE, "detail": "..."}`.

**Authorization is a placeholder in this version:** `authorize` returns ALLOW for any
operation of the caller's run presented with the run's current fencing token. Tenant
policy, credential leases and budgets will replace it.
"""

api = NinjaAPI(
    title="Fenceline worker API",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api-v1",
    auth=WorkerBearer(),
    parser=StrictJSONParser(),
)
errors.install(api)

E = Error


def _run_out(run) -> dict:
    lease = run.lease
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
    }


def _op_out(op) -> dict:
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
                "phase",
                "attempt",
                "dispatch_token",
                "dispatched_at",
                "provider_request_id",
                "error_code",
                "estimated_cost_cents",
                "actual_cost_cents",
                "created_at",
                "updated_at",
            )
        },
    }


# --- runs and leases ------------------------------------------------------------------


@api.post("/runs", response={201: RunCreatedOut, 200: RunCreatedOut, 401: E, 422: E}, tags=["runs"])
def create_run(request, body: RunCreateIn):
    """Create a run. The same external_id returns the existing run with 200."""
    run, created = runs.run_create(worker=request.worker, schema_version=body.schema_version, external_id=body.external_id)
    return Status(201 if created else 200, {"run_id": str(run.pk), "status": run.status})


@api.get("/runs/{run_id}", response={200: RunOut, 401: E, 404: E}, tags=["runs"])
def get_run(request, run_id: str):
    return _run_out(selectors.run_get(tenant=request.worker.tenant, run_id=run_id))


@api.post(
    "/runs/{run_id}/lease",
    response={200: LeaseGrantedOut, 401: E, 404: E, 409: E, 422: E},
    tags=["leases"],
)
def acquire_lease(request, run_id: str, body: LeaseAcquireIn):
    """Take the run's lease. 409 LEASE_HELD while another owner holds an unexpired lease;
    409 WORKER_NOT_ACCEPTING for a worker that is draining, stopped or quarantined."""
    lease = leases.lease_acquire(worker=request.worker, run_id=run_id, owner_id=body.owner_id, ttl_s=body.ttl_s)
    return {"fencing_token": lease.fencing_token, "expires_at": lease.expires_at}


@api.post(
    "/runs/{run_id}/lease/renew",
    response={200: LeaseRenewedOut, 401: E, 404: E, 409: LeaseLostError, 422: E},
    tags=["leases"],
)
def renew_lease(request, run_id: str, body: LeaseRenewIn):
    """Extend the lease. 409 LEASE_LOST with reason owner_changed, token_changed,
    released or expired."""
    lease = leases.lease_renew(
        worker=request.worker, run_id=run_id, owner_id=body.owner_id, fencing_token=body.fencing_token, ttl_s=body.ttl_s
    )
    return {"expires_at": lease.expires_at}


@api.post(
    "/runs/{run_id}/lease/release",
    response={200: LeaseReleasedOut, 401: E, 404: E, 409: LeaseLostError, 422: E},
    tags=["leases"],
)
def release_lease(request, run_id: str, body: LeaseReleaseIn):
    leases.lease_release(worker=request.worker, run_id=run_id, owner_id=body.owner_id, fencing_token=body.fencing_token)
    return {"released": True}


@api.post(
    "/runs/{run_id}/complete",
    response={200: RunCreatedOut, 401: E, 404: E, 409: E, 422: E},
    tags=["runs"],
)
def complete_run(request, run_id: str, body: TokenIn):
    """The run's terminal transition, by the lease owner. The lease ends; effects still in
    flight become UNKNOWN with a reconciliation case; the verifier seals the chain."""
    run = runs.run_complete(worker=request.worker, run_id=run_id, fencing_token=body.fencing_token)
    return {"run_id": str(run.pk), "status": run.status}


# --- operations -------------------------------------------------------------------------


@api.post(
    "/runs/{run_id}/operations",
    response={201: OperationCreatedOut, 200: OperationCreatedOut, 401: E, 404: E, 409: E, 422: E},
    tags=["operations"],
)
def create_operation(request, run_id: str, body: OperationIn):
    """Record the intent of a side effect. Replaying the same idempotency_key with the same
    parameters returns the same operation (200); other parameters: 422 IDEMPOTENCY_MISMATCH."""
    intent = Intent(**body.model_dump(exclude={"fencing_token"}))
    op, created = operations.operation_intend(
        worker=request.worker, run_id=run_id, fencing_token=body.fencing_token, intent=intent
    )
    return Status(201 if created else 200, {"operation_id": str(op.pk), "phase": op.phase})


@api.get("/operations/{operation_id}", response={200: OperationOut, 401: E, 404: E}, tags=["operations"])
def get_operation(request, operation_id: str):
    return _op_out(operations.operation_get(tenant=request.worker.tenant, operation_id=operation_id))


@api.post(
    "/operations/{operation_id}/authorize",
    response={200: AuthorizedOut, 401: E, 404: E, 409: PhaseError | Error, 422: E},
    tags=["operations"],
)
def authorize_operation(request, operation_id: str, body: AuthorizeIn):
    """Placeholder: ALLOW for any operation of the caller's run with the current token."""
    op = operations.operation_authorize(worker=request.worker, operation_id=operation_id, fencing_token=body.fencing_token)
    return {"decision": "ALLOW", "phase": op.phase}


@api.post(
    "/operations/{operation_id}/dispatch",
    response={200: PhaseOut, 401: E, 404: E, 409: PhaseError | Error, 422: E},
    tags=["operations"],
)
def dispatch_operation(request, operation_id: str, body: TokenIn):
    """AUTHORIZED -> DISPATCHED. Only after a 200 here may the worker call the provider."""
    op = operations.operation_dispatch(worker=request.worker, operation_id=operation_id, fencing_token=body.fencing_token)
    return {"phase": op.phase}


@api.post(
    "/operations/{operation_id}/outcome",
    response={200: PhaseOut, 401: E, 404: E, 409: PhaseError | Error, 422: E},
    tags=["operations"],
)
def report_outcome(request, operation_id: str, body: OutcomeIn):
    """Report CONFIRMED, FAILED or UNKNOWN for a DISPATCHED operation. UNKNOWN opens a
    reconciliation case. A report under a fenced token is refused (409 STALE_TOKEN); its
    provider_request_id is kept on the case as unverified evidence."""
    op = operations.operation_report_outcome(
        worker=request.worker,
        operation_id=operation_id,
        fencing_token=body.fencing_token,
        outcome=body.outcome,
        provider_request_id=body.provider_request_id or "",
        actual_cost_cents=body.actual_cost_cents,
        error_code=body.error_code or "",
    )
    return {"phase": op.phase}


@api.get(
    "/operations/{operation_id}/retry-decision",
    response={200: RetryDecisionOut, 401: E, 404: E},
    tags=["operations"],
)
def retry_decision(request, operation_id: str):
    op = operations.operation_get(tenant=request.worker.tenant, operation_id=operation_id)
    decision, reason = retry.operation_retry_decision(op)
    return {"decision": decision, "reason": reason, "phase": op.phase, "attempt": op.attempt, "effect_class": op.effect_class}


# --- events -----------------------------------------------------------------------------


@api.post(
    "/runs/{run_id}/events",
    response={201: EventAppendedOut, 401: E, 404: E, 409: E, 422: E},
    tags=["events"],
)
def append_event(request, run_id: str, body: EventIn):
    """Append a NOTE or an ``x.``-prefixed event (fields: a JSON object of at most 16 KB)."""
    event = notes.event_append(
        worker=request.worker, run_id=run_id, fencing_token=body.fencing_token, type=body.type, fields=body.fields
    )
    return Status(201, {"seq": event.seq, "hash": event.hash})


@api.get("/runs/{run_id}/events", response={401: E, 404: E}, tags=["events"])
def export_events(request, run_id: str):
    """The run's chain in seq order, streamed: {"run_id", "head", "events": [...],
    "checkpoints": [...]}; each event has every field of the canonical form plus its hash.
    Check it anywhere with `python ledger/evidence_verifier.py EXPORT.json --keys KEYS.json`."""
    run = selectors.run_get(tenant=request.worker.tenant, run_id=run_id)
    response = StreamingHttpResponse(_export(run), content_type="application/json")
    return response


def _export(run):
    head = {"last_seq": run.last_seq, "last_hash": run.last_hash}
    yield '{"run_id":%s,"head":%s,"events":[' % (json.dumps(str(run.pk)), json.dumps(head))
    rows = Event.objects.filter(run=run, seq__lte=head["last_seq"]).order_by("seq").iterator(chunk_size=2000)
    for index, event in enumerate(rows):
        yield ("," if index else "") + json.dumps(
            {
                "run_id": str(event.run_id),
                "seq": event.seq,
                "event_id": str(event.event_id),
                "type": event.type,
                "schema_version": event.schema_version,
                "actor": event.actor,
                "occurred_at": format_time(event.occurred_at),
                "fields": event.fields,
                "prev_hash": event.prev_hash,
                "hash": event.hash,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
    checkpoints = Checkpoint.objects.filter(run=run, seq__lte=head["last_seq"]).order_by("seq")
    yield '],"checkpoints":%s}' % json.dumps(
        [
            {
                "run_id": str(run.pk),
                "seq": cp.seq,
                "last_hash": cp.last_hash,
                "verifier_version": cp.verifier_version,
                "key_id": cp.key_id,
                "mac": cp.mac,
            }
            for cp in checkpoints
        ],
        separators=(",", ":"),
    )


@api.post("/fence/check", response={200: FenceCheckOut, 401: E, 422: E}, tags=["leases"])
def check_fence(request, body: FenceCheckIn):
    """For downstream systems that enforce the fence themselves: is this the run's current,
    unexpired token? Unknown runs (and other tenants' runs) answer false."""
    return {"valid": fence_check(tenant=request.worker.tenant, run_id=body.run_id, fencing_token=body.fencing_token)}
