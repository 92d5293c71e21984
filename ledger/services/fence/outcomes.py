"""An operation's outcome: DISPATCHED -> CONFIRMED / FAILED / UNKNOWN, reported by the
worker that dispatched it, under the fence."""

from typing import Any

from ledger.boundary import check_fields, check_text
from ledger.errors import InvalidInput, NotFound, WrongPhase, parse_id
from ledger.models import Operation, Worker
from ledger.services.authority.policy import policy_now
from ledger.services.authority.reservations import cost_settle
from ledger.services.core.fencing import Fenced, fenced
from ledger.services.core.handoff import queues
from ledger.services.core.phases import transition
from ledger.services.evidence.append import json_safe
from ledger.services.fence.ending import IN_FLIGHT
from ledger.services.fence.unknown import operations_mark_unknown
from ledger.services.upgrades import provider_ref as upgrades_ref
from ledger.states import OUTCOME_PHASE, CaseReason, Outcome, Phase


def operation_report_outcome(
    *,
    worker: Worker,
    operation_id: object,
    fencing_token: int,
    outcome: Outcome,
    provider_request_id: str = "",
    actual_cost_cents: int | None = None,
    error_code: str = "",
    provider_ref: dict[str, Any] | None = None,
    fallback_used: bool | None = None,
) -> Operation:
    """DISPATCHED -> CONFIRMED / FAILED / UNKNOWN (UNKNOWN opens a reconciliation case).

    The provider's record is named by ``provider_request_id`` (the old form) or
    ``provider_ref`` {"provider", "id"} (the new one), or both when they agree; it is stored
    in the representations the operation.provider_ref change writes now (``upgrades``).
    The same report sent twice returns the operation unchanged. A report carrying a
    fenced token is refused; if it names a provider request id, that id is kept on the
    operation's reconciliation case as unverified evidence. ``fallback_used``: the worker
    used one of the breaker's fallbacks (policy ``breaker.levers``) for this attempt; kept
    on the operation and in the outcome's event (None: not said)."""
    op_id = parse_id(operation_id, "operation")
    target = OUTCOME_PHASE[Outcome(outcome)]
    # The boundary first, under the names the caller sent (an id is stored and put in events).
    if provider_request_id:
        check_text(provider_request_id, path="provider_request_id")
    if provider_ref is not None:
        check_fields({"provider_ref": provider_ref})
    reported = reported_ref(provider_request_id, provider_ref)
    provider_request_id = reported.id if reported is not None else ""

    def write(ctx: Fenced) -> Operation:
        return _outcome_write(
            ctx,
            target=target,
            reported=reported,
            actual_cost_cents=actual_cost_cents,
            error_code=error_code,
            fallback_used=fallback_used,
        )

    def on_refused(ctx: Fenced, reason: str) -> None:
        _outcome_refused(ctx, outcome=Outcome(outcome), provider_request_id=provider_request_id)

    return fenced(
        worker=worker,
        operation_id=op_id,
        fencing_token=fencing_token,
        attempted="operation.outcome",
        write=write,
        on_refused=on_refused,
        ending=IN_FLIGHT,
    )


def _outcome_write(
    ctx: Fenced,
    *,
    target: Phase,
    reported: upgrades_ref.ProviderRef | None,
    actual_cost_cents: int | None,
    error_code: str,
    fallback_used: bool | None = None,
) -> Operation:
    """The report under the fence: the operation DISPATCHED under this token moves to
    ``target``, its usage settling the cost reservation; the same report again returns it
    unchanged (but for usage it now carries)."""
    op = ctx.operation
    if op is None:  # fenced found the run through this operation
        raise NotFound("operation not found")
    ref = with_provider(reported, op)
    changing = upgrades_ref.phase_now()
    if op.phase == target and op.fencing_token == ctx.fencing_token and _same(op, ref, changing):
        if target != Phase.UNKNOWN and actual_cost_cents is not None:
            # The same report again, now with the usage that was missing: it settles the
            # reservation left UNKNOWN (a closed one is left as it is).
            cost_settle(
                op=op, run=ctx.run, actual_cents=actual_cost_cents, batch=ctx.batch, actor=ctx.actor, now=ctx.now
            )
        return op  # a duplicate of the report that was already recorded
    if op.phase != Phase.DISPATCHED:
        raise WrongPhase(phase=op.phase, wanted=Phase.DISPATCHED)
    if op.fencing_token != ctx.fencing_token:
        raise WrongPhase(phase=f"{op.phase} under another token", wanted="DISPATCHED under this token")
    changes: dict[str, Any] = {
        **upgrades_ref.written(changing, provider=op.provider, ref=ref),
        "actual_cost_cents": actual_cost_cents,
        "error_code": error_code,
    }
    if fallback_used is not None:
        changes["fallback_used"] = fallback_used
    if target != Phase.UNKNOWN:
        transition(op, target, ctx, **changes)
        _settle(op, ctx, actual_cost_cents)
    else:
        operations_mark_unknown(
            operations=[op],
            runs={ctx.run.pk: ctx.run},
            batch=ctx.batch,
            actor=ctx.actor,
            reason=CaseReason.WORKER_REPORTED_UNKNOWN,
            changes=changes,
        )
    return op


def _settle(op: Operation, ctx: Fenced, actual_cost_cents: int | None) -> None:
    """Usage settles the reservation; no usage reported leaves it UNKNOWN until reconciled."""
    cost_settle(
        op=op,
        run=ctx.run,
        actual_cents=actual_cost_cents,
        batch=ctx.batch,
        actor=ctx.actor,
        now=ctx.now,
        policy=policy_now(tenant=ctx.run.tenant, seen=ctx.tenant).document if ctx.tenant else None,
        breaker_seen=ctx.tenant.breaker if ctx.tenant else None,
    )


def _outcome_refused(ctx: Fenced, *, outcome: Outcome, provider_request_id: str) -> None:
    """What a refused report still records, with the refusal: the operation its reporter
    dispatched under the token it lost becomes UNKNOWN now, and a provider request id it
    names is kept on the operation's case as evidence nobody verified."""
    op = ctx.operation
    if op is None:
        raise NotFound("operation not found")
    if op.phase == Phase.DISPATCHED and op.fencing_token == ctx.fencing_token:
        # The reporter dispatched this effect and has lost its lease since: nobody can
        # report for it any more, so its outcome is UNKNOWN now, not at the next sweep.
        operations_mark_unknown(
            operations=[op],
            runs={ctx.run.pk: ctx.run},
            batch=ctx.batch,
            actor=ctx.actor,
            reason=CaseReason.LEASE_LOST,
        )
    if not provider_request_id:
        return
    evidence = json_safe(
        {
            "provider_request_id": provider_request_id,
            "reported_outcome": outcome.value,
            "fencing_token": ctx.fencing_token,
            "reported_at": ctx.now,
            "verified": False,
        }
    )
    case_id = queues().case_attach_unverified_evidence(operation_id=op.pk, evidence=evidence)
    ctx.batch.append(
        ctx.run,
        "UNVERIFIED_EVIDENCE_RECEIVED",
        actor=ctx.actor,
        fields={"operation_id": op.pk, "case_id": case_id, **evidence},
    )


def reported_ref(provider_request_id: str, provider_ref: dict[str, Any] | None) -> upgrades_ref.ProviderRef | None:
    """The provider record a report names: its ``provider_ref``, its ``provider_request_id``,
    or both when they name the same id (else 422 naming provider_ref)."""
    ref = upgrades_ref.parsed(provider_ref)
    if ref is None:
        return upgrades_ref.ProviderRef(provider="", id=provider_request_id) if provider_request_id else None
    if provider_request_id and provider_request_id != ref.id:
        raise InvalidInput("provider_ref.id and provider_request_id name different records", field="provider_ref")
    return ref


def with_provider(ref: upgrades_ref.ProviderRef | None, op: Operation) -> upgrades_ref.ProviderRef | None:
    """The reference at the operation's provider: a reference without one is at it; one at
    another provider is refused (the reconciler would look it up in the wrong place)."""
    if ref is None:
        return None
    if not ref.provider:
        return upgrades_ref.ProviderRef(provider=op.provider, id=ref.id)
    if op.provider and ref.provider != op.provider:
        raise InvalidInput(
            f"provider_ref.provider is {ref.provider!r}; this operation's provider is {op.provider!r}",
            field="provider_ref.provider",
        )
    return ref


def _same(op: Operation, ref: upgrades_ref.ProviderRef | None, phase: str) -> bool:
    """Does ``op`` already hold exactly this provider record (a report sent again)?"""
    if upgrades_ref.disagreement(op, phase) is not None:
        return False
    return upgrades_ref.reference(op, phase) == ref
