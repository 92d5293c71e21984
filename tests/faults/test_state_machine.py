"""Random interleavings of lease and operation calls by several workers, checked against a
model after every step.

Three logical workers (owner ids ``a`` and ``b`` share one Worker identity, ``c`` has
another of the same tenant) acquire, renew and release the leases of two runs, record
intents from a small pool of idempotency keys, authorize, dispatch and report outcomes,
while the test's clock expires leases (by back-dating ``expires_at``) and the reaper
sweeps. Every worker presents the token it was last given, so stale tokens are used the
way a paused worker would use them. Each example starts with one effect in flight on the
first run (and maybe its lease already run out); the random steps decide what becomes of
it, and of the other operations they start.

The model predicts, for every call, whether it succeeds or which refusal it gets (and
why), and exactly which events it appends. After every step the invariants of the brief
are checked against PostgreSQL: fencing tokens and lease history (1), no stale write and
the refusal count (2), one operation per key (3), phase moves, reconciliation cases and
lease loss (4), and the hash chain with its exact growth (5).
"""

import itertools
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from approvals.models import ReconciliationCase
from ledger.chain import GENESIS_HASH, canonical_bytes, format_time, hash_bytes
from ledger.errors import DomainError, IdempotencyMismatch, LeaseHeld, LeaseLost, StaleToken, WrongPhase
from ledger.models import Event, LeaseGrant, Operation, Run, RunLease
from ledger.services.core.fencing import fence_check
from ledger.services.core.intent import Intent
from ledger.services.fence.effects import operation_start
from ledger.services.fence.leases import lease_acquire, lease_release, lease_renew, leases_reap
from ledger.services.fence.operations import operation_authorize, operation_dispatch, operation_intend
from ledger.services.fence.outcomes import operation_report_outcome
from ledger.states import CaseReason, EffectClass, LeaseEnd, Outcome, Phase, can_move
from tests.factories import make_worker, new_run

TTL_S = 600  # long enough that only the test's clock (back-dating) expires a lease
RUN_COUNT = 2

# (owner_id, index of the Worker identity it runs as)
ACTORS = (("a", 0), ("b", 0), ("c", 1))

# Fixed parameters per idempotency key; the run is whichever run first records the key.
KEYS = {
    "deploy:alpha": dict(tool="deploy", action="push", resource="repo:alpha", effect_class=EffectClass.IDEMPOTENT),
    "email:ops": dict(
        tool="email", action="send", resource="mailto:ops@example.com", effect_class=EffectClass.NON_RETRYABLE
    ),
    "search:docs": dict(tool="search", action="query", resource="index:docs", effect_class=EffectClass.PURE),
}
KEY_NAMES = sorted(KEYS)

# An actor is one of ACTORS, or OWNER: whoever holds the lease of the run concerned (actor
# 0 when nobody does), so that calls can make progress. OWNER comes first so that failing
# examples shrink towards the owner acting.
OWNER = "owner"
actors = st.sampled_from([OWNER, *range(len(ACTORS))])
advancing_actors = st.sampled_from([OWNER, OWNER, OWNER, *range(len(ACTORS))])  # the owner half of the time
runs = st.integers(min_value=0, max_value=RUN_COUNT - 1)
keys = st.sampled_from(KEY_NAMES)
outcomes = st.sampled_from([Outcome.CONFIRMED, Outcome.FAILED, Outcome.UNKNOWN])
provider_ids = st.sampled_from(["", "prov-1"])


def intent_for(key: str, **overrides) -> Intent:
    return Intent(idempotency_key=key, **{**KEYS[key], **overrides})


@dataclass
class GrantModel:
    owner: str
    end: LeaseEnd | None = None


@dataclass
class RunModel:
    """What the model expects of one run: its lease, its history, its refusals, its chain."""

    run_id: object
    token: int = 0
    owner: str | None = None
    worker_index: int | None = None
    expired: bool = False
    end: LeaseEnd | None = None  # why the last ownership ended, while nobody owns the lease
    grants: list[GrantModel] = field(default_factory=list)
    stale_rejections: int = 0
    events: list[tuple] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return self.owner is not None and not self.expired

    def fence(self, token: int, owner_id: str | None = None) -> str | None:
        """Why a write with ``token`` (and ``owner_id`` for renew/release) is refused, or None."""
        if self.owner is None and self.token == token:
            return self.end.value.lower() if self.end else "not_held"
        if owner_id is not None and self.owner != owner_id:
            return "owner_changed"
        if self.token != token:
            return "token_changed"
        if self.expired:
            return "expired"
        return None


@dataclass
class OpModel:
    key: str
    run_index: int
    op_id: str
    phase: Phase = Phase.PLANNED
    fencing_token: int | None = None
    dispatch_owner: str | None = None
    provider_request_id: str = ""
    case_reason: CaseReason | None = None
    evidence: int = 0


def event_summary(event: Event) -> tuple:
    """The parts of an event the model predicts."""
    f = event.fields
    t = event.type
    if t.startswith("OPERATION_"):
        return (t, f["operation_id"], f.get("reason") if t == "OPERATION_UNKNOWN" else None)
    if t == "STALE_TOKEN_REJECTED":
        return (t, f["attempted"], f["presented_token"], f["current_token"], f["reason"])
    if t == "LEASE_ACQUIRED":
        return (t, f["owner_id"], f["fencing_token"], f["previous_token"])
    if t in ("LEASE_EXPIRED", "LEASE_RELEASED"):
        return (t, f["owner_id"], f["fencing_token"])
    if t == "LEASE_RENEWED":
        return (t, f["fencing_token"])
    if t == "UNVERIFIED_EVIDENCE_RECEIVED":
        return (t, f["operation_id"], f["case_id"] is not None)
    return (t,)


class LeaseAndOperationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.outcomes = 0  # outcomes recorded by the dispatching worker
        self.orphaned = 0  # DISPATCHED operations made UNKNOWN because their lease was lost
        # Each example runs in its own savepoint, rolled back by teardown(): it starts from
        # a fresh tenant and leaves nothing behind for the reaper of the next example.
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        try:
            slug = f"sm-{uuid.uuid4().hex[:12]}"
            self.workers = [make_worker(slug, f"worker-{i}").worker for i in range(2)]
            self.tenant = self.workers[0].tenant
            self.runs: list[RunModel] = []
            for _ in range(RUN_COUNT):
                run = new_run(self.workers[0])
                self.runs.append(RunModel(run_id=run.pk, events=[("RUN_CREATED",)]))
        except BaseException:
            self.teardown()
            raise
        # The token each logical worker was last given, per run (0 before any).
        self.tokens: dict[tuple[int, int], int] = {}
        self.ops: dict[str, OpModel] = {}
        self.seen_phase: dict[str, str] = {}
        self.ever_dispatched: set[str] = set()

    def teardown(self) -> None:
        # Steer generation towards the interesting interleavings: effects dispatched and
        # then reported, or orphaned by a lost lease.
        target(float(self.outcomes), label="outcomes recorded")
        target(float(self.orphaned), label="dispatched operations orphaned by a lost lease")
        if self._atomic is not None:
            transaction.set_rollback(True)
            self._atomic.__exit__(None, None, None)
            self._atomic = None

    # --- helpers ----------------------------------------------------------------------

    def resolve(self, actor, run_index: int) -> int:
        if actor != OWNER:
            return actor
        owner = self.runs[run_index].owner
        return next((i for i, (owner_id, _) in enumerate(ACTORS) if owner_id == owner), 0)

    def worker_of(self, actor: int):
        return self.workers[ACTORS[actor][1]]

    def token_of(self, actor: int, run_index: int) -> int:
        return self.tokens.get((actor, run_index), 0)

    def ops_of(self, run_index: int) -> list[OpModel]:
        return [op for op in self.ops.values() if op.run_index == run_index]

    def op_at(self, index: int) -> OpModel:
        return list(self.ops.values())[index % len(self.ops)]

    def call(self, what: str, expected: tuple | None, fn):
        """Call a service; ``expected`` is None for success or (error class, reason or None)."""
        try:
            result = fn()
        except DomainError as exc:
            if expected is None:
                raise AssertionError(
                    f"{what}: the model expected success, the service refused with {exc.code}: {exc.detail}"
                ) from exc
            cls, reason = expected
            assert isinstance(exc, cls), f"{what}: expected {cls.__name__}, got {exc.code}: {exc.detail}"
            if reason is not None:
                assert exc.reason == reason, f"{what}: expected refusal reason {reason!r}, got {exc.reason!r}"
            return exc
        assert expected is None, f"{what}: the model expected {expected[0].__name__} ({expected[1]}), it succeeded"
        return result

    def refuse(self, run: RunModel, *, attempted: str, token: int, reason: str) -> None:
        """A fenced write refused: counted on the run and one STALE_TOKEN_REJECTED event."""
        run.stale_rejections += 1
        run.events.append(("STALE_TOKEN_REJECTED", attempted, token, run.token, reason))

    def mark_unknown(self, run: RunModel, op: OpModel, reason: CaseReason) -> None:
        assert op.phase == Phase.DISPATCHED
        if reason != CaseReason.WORKER_REPORTED_UNKNOWN:
            self.orphaned += 1
        op.phase = Phase.UNKNOWN
        op.case_reason = reason
        run.events.append(("OPERATION_UNKNOWN", op.op_id, reason.value))

    def end_lease(self, run: RunModel, end: LeaseEnd) -> None:
        """The model of ``leases_end``: the owner goes, its DISPATCHED operations become UNKNOWN."""
        run.events.append(("LEASE_EXPIRED" if end == LeaseEnd.EXPIRED else "LEASE_RELEASED", run.owner, run.token))
        run.grants[-1].end = end
        run.owner, run.worker_index, run.end = None, None, end
        orphans = [op for op in self.ops_of(self.runs.index(run)) if op.phase == Phase.DISPATCHED]
        if orphans:
            event(f"lease {end.value.lower()} with {len(orphans)} DISPATCHED operation(s)")
        reason = CaseReason.LEASE_LOST if end == LeaseEnd.EXPIRED else CaseReason.LEASE_RELEASED
        for op in orphans:
            self.mark_unknown(run, op, reason)

    @initialize(actor=st.integers(min_value=0, max_value=len(ACTORS) - 1), key=keys, expired=st.booleans())
    def effect_in_flight(self, actor, key, expired):
        """Every example starts with one effect in flight on run 0 (leased, intended,
        authorized, dispatched, and maybe its lease already run out) and run 1 untouched.
        Each call is modelled and checked like any other; the random steps then decide
        what happens to the dispatched effect and its lease."""
        self._acquire(actor, 0)
        self._intend(actor, 0, key, conflicting=False)
        op = self.ops[key]
        self._authorize(actor, op)
        self._dispatch(actor, op)
        if expired:
            self.expire(0)

    # --- lease rules ------------------------------------------------------------------

    @rule(actor=actors, run_index=runs)
    def acquire(self, actor, run_index):
        self._acquire(actor, run_index)

    def _acquire(self, actor, run_index):
        actor = self.resolve(actor, run_index)
        run = self.runs[run_index]
        owner_id, worker_index = ACTORS[actor]
        expected = (LeaseHeld, None) if run.held else None
        result = self.call(
            f"acquire by {owner_id} of run {run_index}",
            expected,
            lambda: lease_acquire(worker=self.worker_of(actor), run_id=run.run_id, owner_id=owner_id, ttl_s=TTL_S),
        )
        if expected is not None:
            return
        previous = run.token
        if run.owner is not None:
            event("takeover of an expired lease")
            self.end_lease(run, LeaseEnd.EXPIRED)
        run.token += 1
        run.owner, run.worker_index, run.expired, run.end = owner_id, worker_index, False, None
        run.grants.append(GrantModel(owner=owner_id))
        run.events.append(("LEASE_ACQUIRED", owner_id, run.token, previous))
        assert result.fencing_token == run.token, f"acquire returned token {result.fencing_token}, model {run.token}"
        self.tokens[(actor, run_index)] = result.fencing_token

    @rule(actor=actors, run_index=runs)
    def renew(self, actor, run_index):
        actor = self.resolve(actor, run_index)
        run = self.runs[run_index]
        owner_id = ACTORS[actor][0]
        token = self.token_of(actor, run_index)
        reason = run.fence(token, owner_id)
        self.call(
            f"renew by {owner_id} of run {run_index} with token {token}",
            (LeaseLost, reason) if reason else None,
            lambda: lease_renew(
                worker=self.worker_of(actor), run_id=run.run_id, owner_id=owner_id, fencing_token=token, ttl_s=TTL_S
            ),
        )
        if reason:
            self.refuse(run, attempted="lease.renew", token=token, reason=reason)
            return
        run.events.append(("LEASE_RENEWED", token))

    @rule(actor=actors, run_index=runs)
    def release(self, actor, run_index):
        actor = self.resolve(actor, run_index)
        run = self.runs[run_index]
        owner_id = ACTORS[actor][0]
        token = self.token_of(actor, run_index)
        reason = run.fence(token, owner_id)
        self.call(
            f"release by {owner_id} of run {run_index} with token {token}",
            (LeaseLost, reason) if reason else None,
            lambda: lease_release(
                worker=self.worker_of(actor), run_id=run.run_id, owner_id=owner_id, fencing_token=token
            ),
        )
        if reason:
            self.refuse(run, attempted="lease.release", token=token, reason=reason)
            return
        self.end_lease(run, LeaseEnd.RELEASED)

    @rule(run_index=runs)
    def expire(self, run_index):
        """The test's clock: the lease's time is up."""
        run = self.runs[run_index]
        RunLease.objects.filter(run_id=run.run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
        run.expired = True

    @rule()
    def reap(self):
        due = [run for run in self.runs if run.owner is not None and run.expired]
        result = leases_reap()
        before = {id(op): op.phase for op in self.ops.values()}
        for run in due:
            self.end_lease(run, LeaseEnd.EXPIRED)
        moved = sum(1 for op in self.ops.values() if before[id(op)] != op.phase)
        # The reaper sweeps the whole database, where rows of other tests may be due too;
        # what it did to this example's runs is checked exactly by the invariants.
        assert result.leases >= len(due), f"reaper swept {result.leases} leases, {len(due)} of this example were due"
        assert result.operations >= moved, f"reaper moved {result.operations} operations, the model expected {moved}"

    # --- operation rules --------------------------------------------------------------

    @rule(actor=advancing_actors, run_index=runs, key=keys, outcome=outcomes, provider_request_id=provider_ids)
    def advance(self, actor, run_index, key, outcome, provider_request_id):
        """A worker takes the operation of ``key`` one phase further: intent (on
        ``run_index`` when the key is new), authorize, dispatch or outcome. When the actor is
        OWNER and nobody holds the lease, it takes the lease instead, so that examples reach
        DISPATCHED often; other actors call with whatever token they remember."""
        op = self.ops.get(key)
        if op is not None:
            run_index = op.run_index
        if actor == OWNER and not self.runs[run_index].held:
            self._acquire(OWNER, run_index)
        elif op is None:
            self._intend(actor, run_index, key, conflicting=False)
        elif op.phase == Phase.PLANNED:
            self._authorize(actor, op)
        elif op.phase == Phase.AUTHORIZED:
            self._dispatch(actor, op)
        else:
            self._report(actor, op, outcome, provider_request_id)

    @precondition(lambda self: self.ops)
    @rule(actor=actors, run_index=runs, key=keys, conflicting=st.booleans())
    def intend_again(self, actor, run_index, key, conflicting):
        """An intent for a key already used, on either run, with the same parameters (a
        replay) or another resource: one operation per key whatever happens."""
        if key not in self.ops:
            key = next(iter(self.ops))
        self._intend(actor, run_index, key, conflicting=conflicting)

    @precondition(lambda self: self.ops)
    @rule(
        actor=actors,
        index=st.integers(min_value=0, max_value=len(KEYS) - 1),
        call=st.sampled_from(["authorize", "dispatch", "outcome"]),
        outcome=outcomes,
        provider_request_id=provider_ids,
    )
    def call_in_any_phase(self, actor, index, call, outcome, provider_request_id):
        """Authorize, dispatch or report whatever phase the operation is in."""
        op = self.op_at(index)
        if call == "authorize":
            self._authorize(actor, op)
        elif call == "dispatch":
            self._dispatch(actor, op)
        else:
            self._report(actor, op, outcome, provider_request_id)

    @rule(actor=advancing_actors, run_index=runs, key=keys)
    def start(self, actor, run_index, key):
        """The one call of ``POST /runs/{id}/effects`` (``operation_start``): intent,
        authorize and dispatch in one transaction, as far as the operation has not gone. A
        refusal is the intent's (the fence cannot move between the steps: the run stays
        locked); a replay past AUTHORIZED is answered as it stands, dispatching nothing."""
        actor = self.resolve(actor, run_index)
        run = self.runs[run_index]
        token = self.token_of(actor, run_index)
        reason = run.fence(token)
        op = self.ops.get(key)
        if reason:
            expected = (StaleToken, reason)
        elif op is not None and op.run_index != run_index:
            expected = (IdempotencyMismatch, None)
        else:
            expected = None
        started = self.call(
            f"start {key!r} on run {run_index} by {ACTORS[actor][0]} with token {token}",
            expected,
            lambda: operation_start(
                worker=self.worker_of(actor), run_id=run.run_id, fencing_token=token, intent=intent_for(key)
            ),
        )
        if reason:
            self.refuse(run, attempted="operation.intend", token=token, reason=reason)
            return
        if expected is not None:
            event("start: idempotency mismatch refused")
            return
        if op is None:
            assert started.created, f"start {key!r}: the first call must create the operation"
            op = self.ops[key] = OpModel(key=key, run_index=run_index, op_id=str(started.operation.pk))
            run.events.append(("OPERATION_PLANNED", op.op_id, None))
        else:
            assert not started.created and str(started.operation.pk) == op.op_id, f"start {key!r}: another operation"
        if op.phase == Phase.PLANNED:
            op.phase = Phase.AUTHORIZED
            run.events.append(("OPERATION_AUTHORIZED", op.op_id, None))
            # One call, two transitions: the phase checker sees the step between them (its
            # OPERATION_AUTHORIZED event is in the chain), so PLANNED -> DISPATCHED is two moves.
            if op.op_id in self.seen_phase:
                self.seen_phase[op.op_id] = Phase.AUTHORIZED.value
        if op.phase == Phase.AUTHORIZED:
            assert run.held and token == run.token
            op.phase, op.fencing_token, op.dispatch_owner = Phase.DISPATCHED, token, run.owner
            run.events.append(("OPERATION_DISPATCHED", op.op_id, None))
            event("start dispatched")
        else:
            event(f"start answered {op.phase}")
        assert started.phase == op.phase, f"start {key!r}: answered {started.phase}, the model says {op.phase}"

    def _intend(self, actor, run_index, key, *, conflicting):
        actor = self.resolve(actor, run_index)
        run = self.runs[run_index]
        token = self.token_of(actor, run_index)
        reason = run.fence(token)
        existing = self.ops.get(key)
        if reason:
            expected = (StaleToken, reason)
        elif existing is not None and (conflicting or existing.run_index != run_index):
            expected = (IdempotencyMismatch, None)
        elif existing is None and conflicting:
            raise AssertionError("a conflicting intent needs an existing operation")
        else:
            expected = None
        overrides = {"resource": KEYS[key]["resource"] + "/other"} if conflicting else {}
        result = self.call(
            f"intent {key!r} on run {run_index} by {ACTORS[actor][0]} with token {token}",
            expected,
            lambda: operation_intend(
                worker=self.worker_of(actor),
                run_id=run.run_id,
                fencing_token=token,
                intent=intent_for(key, **overrides),
            ),
        )
        if reason:
            self.refuse(run, attempted="operation.intend", token=token, reason=reason)
            return
        if expected is not None:
            event("idempotency mismatch refused")
            return
        assert not conflicting
        op, created = result
        if existing is None:
            assert created, f"intent {key!r}: the first intent must create the operation"
            self.ops[key] = OpModel(key=key, run_index=run_index, op_id=str(op.pk))
            run.events.append(("OPERATION_PLANNED", str(op.pk), None))
        else:
            event("intent replayed")
            assert not created, f"intent {key!r}: a replay created a second operation"
            assert str(op.pk) == existing.op_id, f"intent {key!r}: replay returned {op.pk}, not {existing.op_id}"

    def _authorize(self, actor, op):
        actor = self.resolve(actor, op.run_index)
        run = self.runs[op.run_index]
        token = self.token_of(actor, op.run_index)
        reason = run.fence(token)
        if reason:
            expected = (StaleToken, reason)
        elif op.phase == Phase.AUTHORIZED or can_move(op.phase, Phase.AUTHORIZED):
            expected = None
        else:
            expected = (WrongPhase, None)
        self.call(
            f"authorize {op.key!r} ({op.phase}) by {ACTORS[actor][0]} with token {token}",
            expected,
            lambda: operation_authorize(worker=self.worker_of(actor), operation_id=op.op_id, fencing_token=token),
        )
        if reason:
            self.refuse(run, attempted="operation.authorize", token=token, reason=reason)
        elif expected is None and op.phase != Phase.AUTHORIZED:
            op.phase = Phase.AUTHORIZED
            run.events.append(("OPERATION_AUTHORIZED", op.op_id, None))

    def _dispatch(self, actor, op):
        actor = self.resolve(actor, op.run_index)
        run = self.runs[op.run_index]
        token = self.token_of(actor, op.run_index)
        reason = run.fence(token)
        if reason:
            expected = (StaleToken, reason)
        elif op.phase == Phase.AUTHORIZED:
            expected = None
        else:
            expected = (WrongPhase, None)
        self.call(
            f"dispatch {op.key!r} ({op.phase}) by {ACTORS[actor][0]} with token {token}",
            expected,
            lambda: operation_dispatch(worker=self.worker_of(actor), operation_id=op.op_id, fencing_token=token),
        )
        if reason:
            if op.phase == Phase.AUTHORIZED:
                event("stale dispatch of an AUTHORIZED operation refused")
            self.refuse(run, attempted="operation.dispatch", token=token, reason=reason)
        elif expected is None:
            assert run.held and token == run.token
            op.phase, op.fencing_token, op.dispatch_owner = Phase.DISPATCHED, token, run.owner
            run.events.append(("OPERATION_DISPATCHED", op.op_id, None))

    def _report(self, actor, op, outcome, provider_request_id):
        actor = self.resolve(actor, op.run_index)
        run = self.runs[op.run_index]
        token = self.token_of(actor, op.run_index)
        reported = Phase(outcome.value)
        reason = run.fence(token)
        duplicate = False
        if reason:
            expected = (StaleToken, reason)
        elif op.phase == reported and op.fencing_token == token and op.provider_request_id == provider_request_id:
            expected, duplicate = None, True
        elif op.phase != Phase.DISPATCHED or op.fencing_token != token:
            expected = (WrongPhase, None)
        else:
            expected = None
        self.call(
            f"outcome {outcome.value} of {op.key!r} ({op.phase}) by {ACTORS[actor][0]} with token {token}",
            expected,
            lambda: operation_report_outcome(
                worker=self.worker_of(actor),
                operation_id=op.op_id,
                fencing_token=token,
                outcome=outcome,
                provider_request_id=provider_request_id,
            ),
        )
        if reason:
            self.refuse(run, attempted="operation.outcome", token=token, reason=reason)
            if op.phase == Phase.DISPATCHED and op.fencing_token == token:
                event("fenced reporter's DISPATCHED operation made UNKNOWN")
                self.mark_unknown(run, op, CaseReason.LEASE_LOST)
            if provider_request_id:
                has_case = op.phase == Phase.UNKNOWN
                op.evidence += has_case
                run.events.append(("UNVERIFIED_EVIDENCE_RECEIVED", op.op_id, has_case))
            return
        if expected is not None or duplicate:
            return
        event(f"outcome {outcome.value} recorded")
        self.outcomes += 1
        op.provider_request_id = provider_request_id
        if reported == Phase.UNKNOWN:
            self.mark_unknown(run, op, CaseReason.WORKER_REPORTED_UNKNOWN)
        else:
            op.phase = reported
            run.events.append((f"OPERATION_{reported.value}", op.op_id, None))

    # --- invariants, checked against the database after every step --------------------

    @invariant()
    def database_agrees_with_model(self):
        """Invariants 1-5 of the brief, on one read of this example's rows."""
        run_ids = [run.run_id for run in self.runs]
        snap = Snapshot(
            now=timezone.now(),
            runs={row.pk: row for row in Run.objects.filter(pk__in=run_ids)},
            leases={lease.run_id: lease for lease in RunLease.objects.filter(run_id__in=run_ids)},
            grants=list(LeaseGrant.objects.filter(run_id__in=run_ids).order_by("run_id", "fencing_token")),
            operations=list(Operation.objects.filter(tenant=self.tenant).order_by("created_at")),
            cases=list(ReconciliationCase.objects.filter(tenant=self.tenant)),
            events=list(Event.objects.filter(run_id__in=run_ids).order_by("run_id", "seq")),
        )
        self.check_fencing_tokens(snap)
        self.check_no_stale_write_landed(snap)
        self.check_one_operation_per_key(snap)
        self.check_phases_and_lost_leases(snap)
        self.check_chain(snap)

    def check_fencing_tokens(self, snap: "Snapshot") -> None:
        """1. Tokens 1..n, one per ownership change, increasing with time; the lease holds the
        highest; one open grant, the owner's; at most one token passes the fence."""
        for index, run in enumerate(self.runs):
            where = f"invariant 1, run {index}"
            lease = snap.leases[run.run_id]
            grants = [g for g in snap.grants if g.run_id == run.run_id]
            tokens = [g.fencing_token for g in grants]
            assert tokens == list(range(1, len(grants) + 1)), f"{where}: grant tokens not 1..n contiguous: {tokens}"
            times = [g.acquired_at for g in grants]
            assert all(a < b for a, b in itertools.pairwise(times)), f"{where}: grant tokens do not increase with time"
            assert lease.fencing_token == len(grants), (
                f"{where}: lease token {lease.fencing_token} is not the highest grant {len(grants)}"
            )
            assert lease.fencing_token == run.token, f"{where}: lease token {lease.fencing_token}, model {run.token}"
            history = [(g.owner_id, g.end_reason) for g in grants]
            assert history == [(g.owner, g.end) for g in run.grants], (
                f"{where}: lease history {history}, model {[(g.owner, g.end) for g in run.grants]}"
            )
            assert all((g.ended_at is None) == (g.end_reason is None) for g in grants), f"{where}: half-ended grant"
            open_grants = [g for g in grants if g.ended_at is None]
            assert lease.owner_id == run.owner, f"{where}: lease owner {lease.owner_id!r}, model {run.owner!r}"
            assert lease.end_reason == run.end, f"{where}: lease end_reason {lease.end_reason!r}, model {run.end!r}"
            if lease.owner_id is None:
                assert not open_grants, f"{where}: unowned lease, open grants {[g.fencing_token for g in open_grants]}"
                assert lease.worker_id is None, f"{where}: unowned lease keeps a worker"
            else:
                assert [g.fencing_token for g in open_grants] == [lease.fencing_token], (
                    f"{where}: open grants {[g.fencing_token for g in open_grants]} for token {lease.fencing_token}"
                )
                assert open_grants[0].owner_id == lease.owner_id, f"{where}: open grant owner differs from lease owner"
                assert lease.worker_id == self.workers[run.worker_index].pk, f"{where}: lease worker differs"
                expired = lease.expires_at <= snap.now
                assert expired == run.expired, f"{where}: lease expired={expired}, model expired={run.expired}"
            # Every token a worker holds on to, the never-issued 0 and next token, and the
            # current one: at most one of them may pass the fence, and only while held.
            presented = {t for (_, r), t in self.tokens.items() if r == index} | {0, run.token, run.token + 1}
            valid = [
                t for t in sorted(presented) if fence_check(tenant=self.tenant, run_id=run.run_id, fencing_token=t)
            ]
            assert len(valid) <= 1, f"{where}: several tokens pass the fence: {valid}"
            assert valid == ([run.token] if run.held else []), f"{where}: tokens passing the fence {valid}"

    def check_no_stale_write_landed(self, snap: "Snapshot") -> None:
        """2. Every refusal the model expected is counted, and no row changed except by the
        writes the model let through (dispatch tokens were current when written)."""
        for index, run in enumerate(self.runs):
            stale = snap.runs[run.run_id].stale_rejections
            assert stale == run.stale_rejections, (
                f"invariant 2, run {index}: stale_rejections {stale}, the model counted {run.stale_rejections} refusals"
            )
        rows = {str(row.pk): row for row in snap.operations}
        for op in self.ops.values():
            row = rows[op.op_id]
            got = (row.phase, row.fencing_token, row.dispatch_owner_id, row.provider_request_id)
            want = (op.phase, op.fencing_token, op.dispatch_owner, op.provider_request_id)
            assert got == want, (
                f"invariant 2, operation {op.key!r}: (phase, dispatch token, owner, provider id) {got}, model {want}"
            )
            assert row.run_id == self.runs[op.run_index].run_id, f"invariant 2: operation {op.key!r} changed run"

    def check_one_operation_per_key(self, snap: "Snapshot") -> None:
        """3. One operation per (tenant, key), the one the first intent created."""
        got = sorted((row.idempotency_key, str(row.pk)) for row in snap.operations)
        want = sorted((op.key, op.op_id) for op in self.ops.values())
        assert got == want, f"invariant 3: operations per key {got}, model {want}"

    def check_phases_and_lost_leases(self, snap: "Snapshot") -> None:
        """4. Phases move along the table only; nothing dispatched goes back; every UNKNOWN
        has exactly one case; no DISPATCHED operation outlives the lease it was sent under."""
        cases: dict[tuple[str, int], list[ReconciliationCase]] = {}
        for case in snap.cases:
            cases.setdefault((str(case.operation_id), case.attempt), []).append(case)
        by_id = {op.op_id: op for op in self.ops.values()}
        for row in snap.operations:
            op_id = str(row.pk)
            what = f"invariant 4, operation {row.idempotency_key!r}"
            previous = self.seen_phase.get(op_id)
            if previous is not None and previous != row.phase:
                assert can_move(previous, row.phase), f"{what} moved {previous} -> {row.phase}, not a transition"
            self.seen_phase[op_id] = row.phase
            if row.phase == Phase.DISPATCHED or row.fencing_token is not None:
                self.ever_dispatched.add(op_id)
            if op_id in self.ever_dispatched:
                assert row.phase not in (Phase.PLANNED, Phase.AUTHORIZED, Phase.PENDING_APPROVAL), (
                    f"{what} went back to {row.phase} after dispatch"
                )
            if row.phase == Phase.DISPATCHED:
                lease = snap.leases[row.run_id]
                assert lease.owner_id is not None and lease.fencing_token == row.fencing_token, (
                    f"{what} is still DISPATCHED under token {row.fencing_token} after its lease was lost "
                    f"(lease owner {lease.owner_id!r}, token {lease.fencing_token})"
                )
            own = cases.pop((op_id, row.attempt), [])
            model = by_id[op_id]
            if row.phase == Phase.UNKNOWN:
                assert len(own) == 1, f"{what} is UNKNOWN with {len(own)} cases for attempt {row.attempt}"
                assert own[0].reason == model.case_reason, (
                    f"{what}: case reason {own[0].reason}, model {model.case_reason}"
                )
                assert len(own[0].unverified_evidence) == model.evidence, (
                    f"{what}: {len(own[0].unverified_evidence)} unverified evidence entries, model {model.evidence}"
                )
            else:
                assert not own, f"{what} is {row.phase} but has a reconciliation case"
        assert not cases, f"invariant 4: reconciliation cases without their operation attempt: {sorted(cases)}"

    def check_chain(self, snap: "Snapshot") -> None:
        """5. Each run's chain is contiguous, linked and recomputes, its head is the last
        event, and it holds exactly the events the model expected, in order."""
        for index, run in enumerate(self.runs):
            where = f"invariant 5, run {index}"
            row = snap.runs[run.run_id]
            events = [e for e in snap.events if e.run_id == run.run_id]
            assert [e.seq for e in events] == list(range(1, len(events) + 1)), f"{where}: event seqs are not 1..n"
            previous = GENESIS_HASH
            for e in events:
                assert e.prev_hash == previous, f"{where}: event {e.seq} prev_hash does not match event {e.seq - 1}"
                digest = hash_bytes(
                    canonical_bytes(
                        run_id=str(e.run_id),
                        seq=e.seq,
                        event_id=str(e.event_id),
                        type=e.type,
                        schema_version=e.schema_version,
                        actor=e.actor,
                        occurred_at=format_time(e.occurred_at),
                        fields=e.fields,
                        prev_hash=e.prev_hash,
                    )
                )
                assert e.hash == digest, f"{where}: event {e.seq} ({e.type}) hash does not recompute"
                previous = e.hash
            assert (row.last_seq, row.last_hash) == (len(events), previous), f"{where}: head is not the last event"
            got = [event_summary(e) for e in events]
            if got != run.events:
                want = run.events
                first = next(
                    (i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), min(len(got), len(want))
                )
                raise AssertionError(
                    f"{where}: events from seq {first + 1} are {got[first:]}, the model expected {want[first:]}"
                )


@dataclass
class Snapshot:
    now: datetime
    runs: dict
    leases: dict
    grants: list
    operations: list
    cases: list
    events: list


def test_invariants_hold_under_random_interleavings(db):
    run_state_machine_as_test(
        LeaseAndOperationMachine,
        settings=settings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
