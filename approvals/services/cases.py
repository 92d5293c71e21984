"""Reconciliation cases, opened when an operation's outcome becomes UNKNOWN
(``approvals.services.handoff.cases_open``), and the people's decisions on them: claim,
escalate, resolve (UNKNOWN -> RECONCILED with a named person and evidence), bulk resolve."""

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from approvals.models import OPEN_CASE_STATUSES, CaseComment, CaseStatus, ReconciliationCase
from approvals.services.notifications import my_case_notify, tenant_admins
from ledger.actors import user_actor
from ledger.boundary import check_text
from ledger.errors import Forbidden, InvalidInput, NotFound, StateConflictError, WrongPhase, parse_id
from ledger.models import Operation
from ledger.roles import ADMINISTER, OPERATE, can, tenants_for
from ledger.services.authority.reservations import cost_resolve
from ledger.services.core.decisions import acting_name, decision_reason
from ledger.services.core.fencing import Fenced, locked_runs
from ledger.services.core.phases import transition
from ledger.services.evidence.append import ChainBatch, json_safe
from ledger.services.reconciliation.contracts import decision_policy
from ledger.services.upgrades import provider_ref
from ledger.services.upgrades.conflicts import conflict_open
from ledger.states import Phase

RESOLUTIONS = ("HAPPENED", "DID_NOT_HAPPEN", "COMPENSATED")


def case_resolve(
    *,
    case_id: object,
    resolution: str,
    reason: str,
    resolved_by: str = "",
    user: User | AnonymousUser | None = None,
    provider_request_id: str = "",
    actual_cost_cents: int | None = None,
) -> ReconciliationCase:
    """Close an UNKNOWN outcome with a named person and evidence: the operation moves
    UNKNOWN -> RECONCILED, the case is RESOLVED, the cost reservation is settled (or
    released when nothing happened), all as events in the run's chain. HAPPENED needs the
    provider's request id; every resolution needs a reason. Given a console ``user``, their
    OPERATE role on the case's tenant is checked and their username is the actor. A
    reconciler settles through :func:`case_settle` (``approvals/services/lookups.py``)."""
    if not (resolved_by or user is not None) or not reason or not reason.strip():
        raise InvalidInput("a resolution names who made it and why")
    case = _case_for(case_id)
    resolved_by = acting_name(user=user, name=resolved_by, tenant_id=case.tenant_id, perm=OPERATE)
    return case_settle(
        case=case,
        resolution=resolution,
        reason=reason,
        resolved_by=resolved_by,
        actor=user_actor(resolved_by),
        provider_request_id=provider_request_id,
        actual_cost_cents=actual_cost_cents,
    )


def _no_conflict(operation_id: uuid.UUID | str) -> None:
    """Refuse to settle an operation whose provider record disagrees with itself: the
    disagreement becomes a StateConflict for a person, and settling waits for it."""
    op = Operation.objects.get(pk=operation_id)
    if provider_ref.disagreement(op, provider_ref.phase_now()) is None:
        return
    conflict = conflict_open(operation_id=op.pk, found_by="case.settle")
    if conflict is not None:
        raise StateConflictError(
            f"the operation's provider_request_id and provider_ref disagree (state conflict {conflict.pk}): "
            "a person decides which is right first",
            conflict_id=conflict.pk,
        )


def case_settle(
    *,
    case: ReconciliationCase,
    resolution: str,
    reason: str,
    resolved_by: str,
    actor: str,
    provider_request_id: str = "",
    actual_cost_cents: int | None = None,
    lookup: dict[str, Any] | None = None,
) -> ReconciliationCase:
    """The one way a case is resolved, by a person (``case_resolve``) or a reconciler (with
    the ``lookup`` that decided it, recorded on the case and as a CASE_LOOKED_UP event
    before the operation's RECONCILED). Whoever's conditional UPDATE on the open case wins
    decides; the other is refused with the case's current status."""
    _check_settlement(resolution=resolution, reason=reason, provider_request_id=provider_request_id)
    _no_conflict(case.operation_id)
    with transaction.atomic():
        (run,) = locked_runs({"run_id": case.run_id})
        now = timezone.now()
        ctx = Fenced(run=run, batch=ChainBatch(now), now=now, actor=actor, fencing_token=run.lease.fencing_token)
        _case_close(case, resolution=resolution, reason=reason, resolved_by=resolved_by, lookup=lookup, now=now)
        op = Operation.objects.get(pk=case.operation_id)
        if op.phase != Phase.UNKNOWN:
            raise WrongPhase(phase=op.phase, wanted=Phase.UNKNOWN)
        if lookup is not None:
            ctx.batch.append(
                run, "CASE_LOOKED_UP", actor=actor, fields=lookup_event_fields(case, lookup, to="RESOLVED")
            )
        _operation_reconcile(
            op,
            ctx,
            case=case,
            resolution=resolution,
            reason=reason,
            resolved_by=resolved_by,
            provider_request_id=provider_request_id,
            actual_cost_cents=actual_cost_cents,
        )
        ctx.batch.commit()
    case.refresh_from_db()
    return case


def _check_settlement(*, resolution: str, reason: str, provider_request_id: str) -> None:
    """A resolution Fenceline records: one of RESOLUTIONS, HAPPENED with the provider's
    request id as evidence, and texts that pass the secret boundary."""
    if resolution not in RESOLUTIONS:
        raise InvalidInput(f"resolution must be one of {', '.join(RESOLUTIONS)}", field="resolution")
    if resolution == "HAPPENED" and not provider_request_id:
        raise InvalidInput("HAPPENED needs the provider's request id as evidence", field="provider_request_id")
    check_text(reason, path="reason")
    if provider_request_id:
        check_text(provider_request_id, path="provider_request_id")


def _case_close(
    case: ReconciliationCase,
    *,
    resolution: str,
    reason: str,
    resolved_by: str,
    lookup: dict[str, Any] | None,
    now: datetime,
) -> None:
    """The open case -> RESOLVED (with the lookup that decided it, if any), by a conditional
    UPDATE: 0 rows means somebody else decided first, refused with the case's status now."""
    values: dict[str, Any] = {
        "status": CaseStatus.RESOLVED,
        "resolution": resolution,
        "resolution_reason": reason.strip(),
        "resolved_by": resolved_by,
        "resolved_at": now,
    }
    if lookup is not None:
        values.update(lookup_history_update(case, lookup, now=now))
    won = ReconciliationCase.objects.filter(pk=case.pk, status__in=OPEN_CASE_STATUSES).update(**values)
    if won != 1:
        case.refresh_from_db()
        raise WrongPhase(phase=f"case {case.status}", wanted="an open case")


def _operation_reconcile(
    op: Operation,
    ctx: Fenced,
    *,
    case: ReconciliationCase,
    resolution: str,
    reason: str,
    resolved_by: str,
    provider_request_id: str,
    actual_cost_cents: int | None,
) -> None:
    """The case's operation UNKNOWN -> RECONCILED, with its provider record (the id given as
    evidence, else the one it has) and the policy in force when it was decided; then its
    cost reservation is settled (released when nothing happened)."""
    changing = provider_ref.phase_now()
    ref: provider_ref.ProviderRef | None
    if provider_request_id:
        ref = provider_ref.ProviderRef(provider=op.provider, id=provider_request_id)
    else:
        ref = provider_ref.reference(op, changing)
    transition(
        op,
        Phase.RECONCILED,
        ctx,
        reason=reason.strip(),
        reconciliation=resolution,
        **provider_ref.written(changing, provider=op.provider, ref=ref),
        actual_cost_cents=actual_cost_cents if actual_cost_cents is not None else op.actual_cost_cents,
        event_fields={
            "case_id": case.pk,
            "resolution": resolution,
            "resolved_by": resolved_by,
            **decision_policy(ctx.run.tenant),
        },
    )
    cost_resolve(
        op=op,
        run=ctx.run,
        actual_cents=0 if resolution == "DID_NOT_HAPPEN" else actual_cost_cents,
        batch=ctx.batch,
        actor=ctx.actor,
        now=ctx.now,
    )


def lookup_history_update(case: ReconciliationCase, lookup: dict[str, Any], *, now: datetime) -> dict[str, Any]:
    """The case's lookup columns after one more lookup (the caller holds the run lock and
    the lookup claim, so nobody else appends to this history meanwhile)."""
    entry = {"at": now, **lookup}
    return {
        "lookup_history": [*case.lookup_history, json_safe(entry)],
        "verdict": str(lookup.get("verdict") or "")[:16],
        "lookup_attempts": case.lookup_attempts + 1,
        "lookup_claimed_until": None,
    }


def lookup_event_fields(case: ReconciliationCase, lookup: dict[str, Any], *, to: str) -> dict[str, Any]:
    return {
        "case_id": case.pk,
        "operation_id": case.operation_id,
        "attempt": case.attempt,
        "lookup": case.lookup_attempts + 1,
        "to": to,
        **lookup,
    }


def _case_for(case_id: object) -> ReconciliationCase:
    case = ReconciliationCase.objects.filter(pk=parse_id(case_id, "case")).first()
    if case is None:
        raise NotFound("case not found")
    return case


def _case_move(
    *,
    case_id: object,
    user: User | AnonymousUser,
    sources: tuple[CaseStatus, ...],
    target: CaseStatus,
    event: str,
    reason: str = "",
    claim_for: str | None = None,
    held_by: str | None = None,
    extra_fields: dict[str, Any] | None = None,
) -> ReconciliationCase:
    """One case transition by a console user: the role is checked on the case's tenant, the
    run is locked, the conditional UPDATE on the current status (and, with ``held_by``, on
    who holds it) decides, and exactly one event naming the user (and reason) is appended in
    the same transaction. ``claim_for``: the person it is CLAIMED for afterwards ("" lets go)."""
    case = _case_for(case_id)
    name = acting_name(user=user, name="", tenant_id=case.tenant_id, perm=OPERATE)
    with transaction.atomic():
        (run,) = locked_runs({"run_id": case.run_id})
        now = timezone.now()
        values: dict[str, Any] = {"status": target}
        if claim_for is not None:
            values.update(claimed_by=claim_for, claimed_at=now if claim_for else None)
        if target == CaseStatus.ESCALATED and CaseStatus.ESCALATED not in sources:
            values.update(escalated_by=name, escalation_reason=reason, escalated_at=now)
        current = ReconciliationCase.objects.filter(pk=case.pk, status__in=sources)
        if held_by is not None:
            current = current.filter(claimed_by=held_by)
        if current.update(**values) != 1:
            case.refresh_from_db()
            holder = f" held by {case.claimed_by}" if case.status == CaseStatus.CLAIMED else ""
            raise WrongPhase(phase=f"case {case.status}{holder}", wanted=" or ".join(sources))
        batch = ChainBatch(now)
        fields = {
            "case_id": case.pk,
            "operation_id": case.operation_id,
            "attempt": case.attempt,
            **(extra_fields or {}),
        }
        if reason:
            fields["reason"] = reason
        batch.append(run, event, actor=user_actor(name), fields=fields)
        batch.commit()
    case.refresh_from_db()
    return case


def case_claim(*, case_id: object, user: User | AnonymousUser) -> ReconciliationCase:
    """An operator takes an OPEN case: OPEN -> CLAIMED, with a CASE_CLAIMED event. A case a
    reconciler is still looking up (LOOKUP) may be taken over too: the lookups stop."""
    return _case_move(
        case_id=case_id,
        user=user,
        sources=(CaseStatus.LOOKUP, CaseStatus.OPEN),
        target=CaseStatus.CLAIMED,
        event="CASE_CLAIMED",
        claim_for=str(user.username),
    )


def case_unclaim(*, case_id: object, user: User | AnonymousUser, reason: str) -> ReconciliationCase:
    """Let go of a CLAIMED case, with the reason: CLAIMED -> OPEN (back in the unclaimed
    queue), with a CASE_UNCLAIMED event naming who let go of whose claim."""
    reason = decision_reason(reason)
    case = _case_for(case_id)
    return _case_move(
        case_id=case_id,
        user=user,
        sources=(CaseStatus.CLAIMED,),
        target=CaseStatus.OPEN,
        event="CASE_UNCLAIMED",
        reason=reason,
        claim_for="",
        held_by=case.claimed_by,
        extra_fields={"claimed_by": case.claimed_by},
    )


def case_reassign(*, case_id: object, user: User | AnonymousUser, to: str, reason: str) -> ReconciliationCase:
    """Hand an open case to another person who may operate on its tenant, with the reason:
    OPEN or CLAIMED -> CLAIMED by ``to``; an ESCALATED case stays ESCALATED (who escalated
    it and why are kept), now held by ``to``; with a CASE_REASSIGNED event {from, to,
    reason}. Refused for a person who could not resolve it themselves."""
    reason = decision_reason(reason)
    case = _case_for(case_id)
    target = get_user_model().objects.filter(username=to, is_active=True).first()
    if target is None or not can(target, case.tenant, OPERATE):
        raise InvalidInput(f"{to!r} is not someone who may work cases of this tenant", field="to")
    escalated = case.status == CaseStatus.ESCALATED
    moved = _case_move(
        case_id=case_id,
        user=user,
        sources=(CaseStatus.ESCALATED,) if escalated else (CaseStatus.OPEN, CaseStatus.CLAIMED),
        target=CaseStatus.ESCALATED if escalated else CaseStatus.CLAIMED,
        event="CASE_REASSIGNED",
        reason=reason,
        claim_for=str(target.username),
        held_by=case.claimed_by if case.status == CaseStatus.CLAIMED else None,
        extra_fields={"from": case.claimed_by or None, "to": str(target.username)},
    )
    if target.pk != user.pk:  # routed to the person it was handed to (their own route, if any)
        my_case_notify(
            case=moved,
            usernames=[str(target.username)],
            perm=OPERATE,
            what="reassigned",
            headline=f"Case {str(moved.pk)[:8]} ({_what(moved)}, {moved.reason}) was handed to you by "
            f"{user.username}: {reason}",
        )
    return moved


COMMENT_MAX_LENGTH = 1000


def case_comment(*, case_id: object, user: User | AnonymousUser, text: str) -> CaseComment:
    """A note on a case (open or resolved) by a person who may operate on its tenant: kept
    on the case's thread and appended to the run's chain as CASE_COMMENTED. The text passes
    the secret boundary (a credential-like text is refused, never stored)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("a comment needs some text", field="text")
    text = text.strip()
    if len(text) > COMMENT_MAX_LENGTH:
        raise InvalidInput(f"a comment is at most {COMMENT_MAX_LENGTH} characters", field="text")
    check_text(text, path="text")
    case = _case_for(case_id)
    name = acting_name(user=user, name="", tenant_id=case.tenant_id, perm=OPERATE)
    with transaction.atomic():
        (run,) = locked_runs({"run_id": case.run_id})
        now = timezone.now()
        comment = CaseComment.objects.create(case=case, author=name, text=text, created_at=now)
        batch = ChainBatch(now)
        batch.append(
            run,
            "CASE_COMMENTED",
            actor=user_actor(name),
            fields={"case_id": case.pk, "operation_id": case.operation_id, "comment_id": comment.pk, "text": text},
        )
        batch.commit()
    return comment


def case_escalate(*, case_id: object, user: User | AnonymousUser, reason: str) -> ReconciliationCase:
    """An operator hands an open case up: OPEN or CLAIMED -> ESCALATED, with the reason."""
    if not reason or not reason.strip():
        raise InvalidInput("an escalation says why")
    check_text(reason, path="reason")
    moved = _case_move(
        case_id=case_id,
        user=user,
        sources=(CaseStatus.LOOKUP, CaseStatus.OPEN, CaseStatus.CLAIMED),
        target=CaseStatus.ESCALATED,
        event="CASE_ESCALATED",
        reason=reason.strip(),
    )
    # An escalation goes up to the tenant's admins: routed to each one's own route, if any.
    my_case_notify(
        case=moved,
        usernames=[name for name in tenant_admins(moved.tenant_id) if name != user.username],
        perm=ADMINISTER,
        what="escalated",
        headline=f"Case {str(moved.pk)[:8]} ({_what(moved)}, {moved.reason}) was escalated by {user.username}: "
        f"{reason.strip()}",
    )
    return moved


def _what(case: ReconciliationCase) -> str:
    return f"{case.operation.tool}.{case.operation.action}"


BULK_RESOLUTIONS = ("DID_NOT_HAPPEN", "COMPENSATED")  # HAPPENED needs each case's own provider id
# What a bulk action (the queue's ticked cases, or a case group's) does, and the statuses a
# case must be in for it to be touched: the single actions' sources.
BULK_ACTIONS: dict[str, tuple[CaseStatus, ...]] = {
    "resolve": OPEN_CASE_STATUSES,
    "claim": (CaseStatus.LOOKUP, CaseStatus.OPEN),
    "escalate": (CaseStatus.LOOKUP, CaseStatus.OPEN, CaseStatus.CLAIMED),
}


def cases_preview(
    *, case_ids: Iterable[object], user: User | AnonymousUser, action: str = "resolve"
) -> list[ReconciliationCase]:
    """Exactly the cases a bulk ``action`` by ``user`` on ``case_ids`` will touch: those in a
    status the action applies to, on tenants where the user may operate, in the order they
    will be acted on."""
    ids: set[uuid.UUID] = set()
    for raw in case_ids:
        try:
            ids.add(parse_id(raw, "case"))
        except NotFound:
            continue
    return list(
        ReconciliationCase.objects.filter(
            pk__in=ids, status__in=BULK_ACTIONS.get(action, ()), tenant__in=tenants_for(user, OPERATE)
        )
        .select_related("operation", "run")
        .order_by("opened_at", "id")
    )


def _bulk_cases(
    *, case_ids: Iterable[object], user: User | AnonymousUser, sources: tuple[CaseStatus, ...]
) -> list[ReconciliationCase]:
    """The cases of a bulk action, each visible, on a tenant where ``user`` may operate and in
    one of ``sources``, or a refusal naming the first that is not (nothing changes)."""
    wanted = {parse_id(raw, "case") for raw in case_ids}
    if not wanted:
        raise InvalidInput("choose at least one case", field="case")
    found = list(ReconciliationCase.objects.filter(pk__in=wanted).select_related("tenant").order_by("opened_at", "id"))
    if len(found) != len(wanted):
        raise NotFound("case not found")
    for case in found:
        if not can(user, case.tenant, OPERATE):
            raise Forbidden("your role on this tenant does not allow this action")
        if case.status not in sources:
            raise WrongPhase(
                phase=f"case {case.status}",
                wanted="an open case" if sources == OPEN_CASE_STATUSES else " or ".join(sources),
            )
    return found


def cases_resolve_bulk(
    *, case_ids: Iterable[object], user: User | AnonymousUser, resolution: str, reason: str
) -> list[ReconciliationCase]:
    """Resolve several cases with one resolution and reason, all or none: every case must
    still be open and on a tenant where ``user`` may operate, or nothing changes."""
    if resolution not in BULK_RESOLUTIONS:
        raise InvalidInput(f"bulk resolution must be one of {', '.join(BULK_RESOLUTIONS)}", field="resolution")
    if not reason or not reason.strip():
        raise InvalidInput("a resolution says why", field="reason")
    found = _bulk_cases(case_ids=case_ids, user=user, sources=BULK_ACTIONS["resolve"])
    with transaction.atomic():
        return [case_resolve(case_id=case.pk, user=user, resolution=resolution, reason=reason) for case in found]


def cases_claim_bulk(*, case_ids: Iterable[object], user: User | AnonymousUser) -> list[ReconciliationCase]:
    """Claim several cases for ``user``, all or none (each as :func:`case_claim`)."""
    found = _bulk_cases(case_ids=case_ids, user=user, sources=BULK_ACTIONS["claim"])
    with transaction.atomic():
        return [case_claim(case_id=case.pk, user=user) for case in found]


def cases_escalate_bulk(
    *, case_ids: Iterable[object], user: User | AnonymousUser, reason: str
) -> list[ReconciliationCase]:
    """Escalate several cases with one reason, all or none (each as :func:`case_escalate`)."""
    reason = decision_reason(reason)
    found = _bulk_cases(case_ids=case_ids, user=user, sources=BULK_ACTIONS["escalate"])
    with transaction.atomic():
        return [case_escalate(case_id=case.pk, user=user, reason=reason) for case in found]
