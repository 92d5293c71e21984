"""Handing work to a person: the steps a fenced call, an authority check or a lost lease
takes to open a reconciliation case or an approval request, and to use or void an approval.

The steps belong to the approvals app, which owns those queues and their rows
(``approvals/services/handoff.py``). The fence and the authority checks reach them through
this small interface, which approvals registers when Django starts (``approvals.apps``): so
ledger never imports approvals, and approvals builds on ledger's own steps (the fence, the
chain, an operation's phase change, the cost reservations) without an import circle.

Every step runs inside the caller's transaction, with the affected runs locked, and writes
its events into the caller's :class:`~ledger.services.evidence.append.ChainBatch`. One read
comes the same way: how long a run's outcomes were UNKNOWN, from its cases, which the worker
API's answer for a run shows (its liveness).
"""

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, TypedDict

from django.core.exceptions import ImproperlyConfigured

from ledger.models import CapabilityBudget, Operation, Run
from ledger.services.evidence.append import ChainBatch
from ledger.states import ApprovalKind, CaseReason


class Approval(Protocol):
    pk: Any


class UnknownTime(TypedDict):
    """How long outcomes were (or still are) UNKNOWN, from their reconciliation cases: open
    ones count to now."""

    open_cases: int
    seconds_in_unknown: float
    unknown_since: datetime | None


class HumanQueues(Protocol):
    def cases_open(self, *, operations: Sequence[Operation], reason: CaseReason, now: datetime) -> dict[Any, Any]:
        """One case per (operation, attempt); returns {operation_id: case}."""

    def case_attach_unverified_evidence(self, *, operation_id: uuid.UUID, evidence: dict[str, Any]) -> Any:
        """Add evidence nobody verified to the operation's open case; returns its id or None."""

    def approval_open(
        self,
        *,
        run: Run,
        kind: ApprovalKind,
        fencing_token: int,
        ttl_s: int,
        batch: ChainBatch,
        actor: str,
        operation: Operation | None = None,
        capability: CapabilityBudget | None = None,
    ) -> Approval:
        """The live request for this exact binding, or a new PENDING one."""

    def approval_usable(
        self, *, operation: Operation, kind: ApprovalKind, fencing_token: int, now: datetime
    ) -> Approval | None:
        """An APPROVED, unused, unexpired approval bound to this attempt, digest and token."""

    def approval_use(self, *, approval: Approval, run: Run, batch: ChainBatch, actor: str) -> None:
        """Consume an approval once (APPROVED -> USED), or refuse with WrongPhase."""

    def approvals_void_for_runs(self, *, runs: Sequence[Run], batch: ChainBatch, actor: str) -> int:
        """A change of lease owner voids the live approvals asked under the old token."""

    def run_unknown_time(self, *, run: Run, now: datetime) -> UnknownTime:
        """How long the run's outcomes were (or are) UNKNOWN, from its cases."""


_registered: HumanQueues | None = None


def register(implementation: HumanQueues) -> None:
    global _registered
    _registered = implementation


def queues() -> HumanQueues:
    if _registered is None:
        raise ImproperlyConfigured("no human queues are registered: 'approvals' must be in INSTALLED_APPS")
    return _registered
