"""Provider lookups before people: the job that looks UNKNOWN effects up at their provider
(the run-lease article: "query the provider with a stable idempotency key where possible,
and only then decide whether to retry, compensate, or ask for approval").

A case opens in LOOKUP when its operation has a reconciler (``ledger/services/reconciliation``).
Each pass of ``cases_look_up``:

1. claims due LOOKUP cases set-based (``SELECT ... FOR UPDATE SKIP LOCKED`` and one UPDATE
   of their claim expiry), so passes running at once never take the same case;
2. asks the providers, several at once, outside any transaction;
3. settles each answer under the run lock, each in its own transaction:

   HAPPENED        -> RECONCILED (HAPPENED) by ``reconciler:<name>``, with the provider's id
   DID_NOT_HAPPEN  -> RECONCILED (DID_NOT_HAPPEN); the retry decision then follows the class
   PENDING         -> looked up again after a backoff (base x 2^n, capped, with jitter)
   unavailable     -> the same backoff, or longer when the provider asked for longer (429)
   CANNOT_TELL     -> OPEN: the people's queue, with the lookup history on the case
   attempts spent  -> OPEN, likewise

Every lookup is recorded on the case (``lookup_history``) and as a CASE_LOOKED_UP event in
the run's chain: what was asked, the status, a digest of the answer, the verdict — never the
answer's body or a secret. A person who claims or resolves the case meanwhile wins: the
reconciler's conditional UPDATE on ``status = LOOKUP`` (or on an open case) then changes
nothing and the answer is dropped (``lost``).
"""

from __future__ import annotations

import logging
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models import CaseStatus, ReconciliationCase
from approvals.services.cases import case_settle, lookup_event_fields, lookup_history_update
from ledger.actors import reconciler_actor
from ledger.errors import ForbiddenField, InvalidInput, WrongPhase
from ledger.services.core.fencing import locked_runs
from ledger.services.evidence.append import ChainBatch
from ledger.services.reconciliation.protocol import Lookup, ProviderUnavailable, Verdict
from ledger.services.reconciliation.registry import reconciler_named
from ledger.services.upgrades import provider_ref
from ledger.services.upgrades.conflicts import conflict_open

log = logging.getLogger(__name__)
RETRY_AFTER_CAP_S = 3600  # a provider's Retry-After delays a case's next lookup this long at most


@dataclass
class LookupPass:
    claimed: int = 0
    happened: int = 0
    did_not_happen: int = 0
    later: int = 0  # PENDING or the provider unavailable: looked up again after a backoff
    to_people: int = 0
    lost: int = 0  # a person (or another pass) decided first
    verdicts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Answer:
    lookup: Lookup | None  # None: the provider did not answer
    unavailable: str = ""
    retry_after_s: float | None = None  # the provider asked to be left alone this long (429)


def cases_look_up(*, batch_size: int | None = None, now: datetime | None = None) -> LookupPass:
    """One pass over due LOOKUP cases (at most ``batch_size``); safe to run twice at once."""
    config = settings.FENCELINE
    result = LookupPass()
    cases = _claim(batch_size or config["RECONCILE_BATCH_SIZE"], now=now or timezone.now())
    result.claimed = len(cases)
    if not cases:
        return result
    with ThreadPoolExecutor(max_workers=min(config["RECONCILE_CONCURRENCY"], len(cases))) as pool:
        answers = list(pool.map(_ask, cases))
    for case, answer in zip(cases, answers, strict=True):
        outcome = _settle(case, answer)
        setattr(result, outcome, getattr(result, outcome) + 1)
        verdict = answer.lookup.verdict.value if answer.lookup else "UNAVAILABLE"
        result.verdicts[verdict] = result.verdicts.get(verdict, 0) + 1
    return result


def _claim(limit: int, *, now: datetime) -> list[ReconciliationCase]:
    claim_until = now + timedelta(seconds=settings.FENCELINE["RECONCILE_CLAIM_S"])
    with transaction.atomic():
        ids = list(
            ReconciliationCase.objects.select_for_update(skip_locked=True)
            .filter(status=CaseStatus.LOOKUP, next_lookup_at__lte=now)
            .filter(Q(lookup_claimed_until__isnull=True) | Q(lookup_claimed_until__lt=now))
            .order_by("next_lookup_at")
            .values_list("pk", flat=True)[:limit]
        )
        if not ids:
            return []
        ReconciliationCase.objects.filter(pk__in=ids).update(lookup_claimed_until=claim_until)
    return list(ReconciliationCase.objects.filter(pk__in=ids).select_related("operation").order_by("next_lookup_at"))


def _request_id_hint(case: ReconciliationCase) -> str:
    """A provider request id a fenced worker reported (unverified: the lookup verifies it)."""
    for evidence in reversed(case.unverified_evidence):
        if isinstance(evidence, dict) and evidence.get("provider_request_id"):
            return str(evidence["provider_request_id"])
    return ""


def _ask(case: ReconciliationCase) -> _Answer:
    op = case.operation
    if provider_ref.disagreement(op, provider_ref.phase_now()) is not None:
        # Which record to look up is itself in question: a person decides that first.
        conflict = conflict_open(operation_id=op.pk, found_by=f"reconciler:{case.reconciler}")
        why = (
            f"the operation's provider record disagrees with itself (state conflict {conflict.pk if conflict else '?'})"
        )
        return _Answer(Lookup(Verdict.CANNOT_TELL, asked="", why=why))
    reconciler = reconciler_named(case.reconciler)
    if reconciler is None:
        lookup = Lookup(Verdict.CANNOT_TELL, asked="", why=f"no reconciler named {case.reconciler!r} is configured")
        return _Answer(lookup)
    try:
        return _Answer(reconciler.lookup(case.operation, request_id=_request_id_hint(case)))
    except ProviderUnavailable as exc:
        return _Answer(None, unavailable=str(exc), retry_after_s=exc.retry_after_s)
    except Exception as exc:  # a reconciler's bug must not stop the pass: a person decides
        log.exception("reconciler %s failed on case %s", case.reconciler, case.pk)
        return _Answer(Lookup(Verdict.CANNOT_TELL, asked="", why=f"the reconciler failed ({type(exc).__name__})"))


def _settle(case: ReconciliationCase, answer: _Answer) -> str:
    try:
        return _settle_answer(case, answer)
    except (ForbiddenField, InvalidInput):
        # What the provider answered (an id, a path) did not pass the secret boundary or
        # cannot be stored: nothing of it is kept, and a person decides.
        refused = Lookup(Verdict.CANNOT_TELL, asked="", why="the provider's answer could not be kept as evidence")
        return _settle_answer(case, _Answer(refused))


def _settle_answer(case: ReconciliationCase, answer: _Answer) -> str:
    actor = reconciler_actor(case.reconciler)
    lookup = answer.lookup
    try:
        if lookup is not None and lookup.verdict in (Verdict.HAPPENED, Verdict.DID_NOT_HAPPEN):
            case_settle(
                case=case,
                resolution=lookup.verdict.value,
                reason=f"{actor}: {lookup.why}",
                resolved_by=actor,
                actor=actor,
                provider_request_id=lookup.provider_request_id,
                actual_cost_cents=lookup.actual_cost_cents,
                lookup={"reconciler": case.reconciler, **lookup.evidence()},
            )
            return "happened" if lookup.verdict == Verdict.HAPPENED else "did_not_happen"
        return _keep_or_hand_over(case, answer, actor)
    except WrongPhase:
        return "lost"


def _keep_or_hand_over(case: ReconciliationCase, answer: _Answer, actor: str) -> str:
    """PENDING or unavailable: again after a backoff, until the attempts are spent; then, or
    on CANNOT_TELL, the case goes to people (LOOKUP -> OPEN)."""
    config = settings.FENCELINE
    lookup = answer.lookup
    evidence = (
        {"reconciler": case.reconciler, **lookup.evidence()}
        if lookup is not None
        else {"reconciler": case.reconciler, "verdict": "UNAVAILABLE", "why": answer.unavailable}
    )
    attempts = case.lookup_attempts + 1
    cannot_tell = lookup is not None and lookup.verdict == Verdict.CANNOT_TELL
    spent = attempts >= config["RECONCILE_MAX_ATTEMPTS"]
    to_people = cannot_tell or spent
    if spent and not cannot_tell:
        evidence["why"] = f"{evidence['why']}; {attempts} lookups without an answer"
    with transaction.atomic():
        (run,) = locked_runs({"run_id": case.run_id})
        now = timezone.now()
        values = lookup_history_update(case, evidence, now=now)
        if to_people:
            values["status"] = CaseStatus.OPEN
            values["next_lookup_at"] = None
        else:
            # Never sooner than the provider asked (a 429's Retry-After, at most an hour),
            # whatever the backoff says.
            wait = max(backoff_s(attempts), min(answer.retry_after_s or 0.0, RETRY_AFTER_CAP_S))
            values["next_lookup_at"] = now + timedelta(seconds=wait)
        won = ReconciliationCase.objects.filter(pk=case.pk, status=CaseStatus.LOOKUP).update(**values)
        if won != 1:
            raise WrongPhase(phase="case taken over", wanted=CaseStatus.LOOKUP)
        batch = ChainBatch(now)
        fields = lookup_event_fields(case, evidence, to=CaseStatus.OPEN if to_people else CaseStatus.LOOKUP)
        if not to_people:
            fields["next_lookup_at"] = values["next_lookup_at"]
        batch.append(run, "CASE_LOOKED_UP", actor=actor, fields=fields)
        batch.commit()
    return "to_people" if to_people else "later"


def backoff_s(attempts: int) -> float:
    """Seconds before lookup ``attempts + 1``: base x 2^(attempts - 1), capped, +/- 20 % jitter."""
    config = settings.FENCELINE
    delay: float = min(config["RECONCILE_BACKOFF_MAX_S"], config["RECONCILE_BACKOFF_BASE_S"] * 2 ** (attempts - 1))
    return delay * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not security
