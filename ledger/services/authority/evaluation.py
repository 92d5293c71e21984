"""Authority at authorize and at dispatch: the checks, in one order, in one place.

1. the credential lease (the Credential Lease article's order): DENY_REVOKED,
   DENY_EXPIRED, DENY_STALE_VERSION, DENY_ACTION, DENY_RESOURCE — or DENY_POLICY when the
   policy requires a lease and none is named;
2. the tenant policy in force now: DENY_POLICY;
3. the run's capability for the tool, matched exactly: DENY_NO_CAPABILITY, DENY_EXPIRED,
   DENY_BUDGET (calls or bytes spent);
4. the tenant's cost breaker: DENY_BUDGET;
5. a person's approval where the policy asks for one: APPROVAL_REQUIRED.

Dispatch runs all of it again under the current policy version and then, in a savepoint of
the same transaction as the phase change, reserves one capability call (and its bytes), the
worst-case cost on every budget key, and consumes the approval. Any refusal takes back every
reservation of that attempt.
"""

from dataclasses import dataclass
from typing import Any

from ledger.errors import Denied, parse_id
from ledger.models import CapabilityBudget, CostReservation, Credential, CredentialLease, Operation
from ledger.policy import allows, contract_for, needs_human
from ledger.services.authority.breaker import breaker_allows
from ledger.services.authority.policy import policy_now
from ledger.services.authority.reservations import cost_reserve
from ledger.services.core.fencing import CAPABILITIES_SEEN, Fenced
from ledger.services.core.handoff import Approval, queues
from ledger.sql import rows as sql_rows
from ledger.states import ApprovalKind, CapabilityStatus


@dataclass
class Grounds:
    """What an ALLOW rests on."""

    policy_version: int
    policy: dict[str, Any]
    lease: CredentialLease | None = None
    capability: CapabilityBudget | None = None
    approval: Approval | None = None
    waiting_for: Approval | None = None  # a capability approval still pending
    needs_approval: bool = False


def evaluate(*, op: Operation, ctx: Fenced, lease_id: object = None, at_dispatch: bool = False) -> Grounds:
    now = policy_now(tenant=ctx.run.tenant, seen=ctx.tenant)
    version, policy = now.version, now.document
    grounds = Grounds(policy_version=version, policy=policy)
    grounds.lease = _check_credential(op, ctx, policy, lease_id=lease_id, at_dispatch=at_dispatch)
    why = allows(policy, tool=op.tool, action=op.action, resource=op.resource)
    if why is not None:
        raise Denied("DENY_POLICY", why, policy_version=version)
    _check_capability(op, ctx, policy, grounds)
    refusal = breaker_allows(
        tenant=ctx.run.tenant, op=op, policy=policy, attempt_is_retry=op.attempt > 1, stored=now.breaker
    )
    if refusal is not None:
        raise refusal
    contract = contract_for(policy, op.tool, op.action)
    if needs_human(policy, op.tool) or (contract is not None and contract.get("human_approval")):
        grounds.approval = queues().approval_usable(
            operation=op, kind=ApprovalKind.OPERATION, fencing_token=ctx.fencing_token, now=ctx.now
        )
        grounds.needs_approval = grounds.approval is None
    return grounds


def _check_credential(
    op: Operation, ctx: Fenced, policy: dict[str, Any], *, lease_id: object, at_dispatch: bool
) -> CredentialLease | None:
    if at_dispatch:
        lease = op.credential_lease
    elif lease_id is not None:
        lease = sql_rows.get(CredentialLease, ("credential",), id=parse_id(lease_id, "credential lease"))
        if lease is None or lease.run_id != ctx.run.pk:
            raise Denied("DENY_POLICY", "no such credential lease for this run")
        lease.__dict__["credential_version_now"] = lease.credential.version
    else:
        lease = None
    if lease is None:
        if policy["require_credential"]:
            raise Denied("DENY_POLICY", "the tenant policy requires a credential lease for every operation")
        return None
    if lease.revoked_at is not None:
        raise Denied("DENY_REVOKED", f"credential lease {lease.pk} was revoked")
    if ctx.now >= lease.expires_at:
        raise Denied("DENY_EXPIRED", f"credential lease {lease.pk} expired")
    # The credential's version read with the lease (by the fence's locking statement, or
    # the query above), else now.
    current = getattr(lease, "credential_version_now", None)
    if current is None:
        current = Credential.objects.filter(pk=lease.credential_id).values_list("version", flat=True).get()
    if lease.version != current:
        raise Denied(
            "DENY_STALE_VERSION", f"credential lease {lease.pk} is for version {lease.version}; current is {current}"
        )
    if op.action not in lease.actions:
        raise Denied("DENY_ACTION", f"credential lease {lease.pk} does not allow action {op.action!r}")
    if op.resource not in lease.resources:
        raise Denied("DENY_RESOURCE", f"credential lease {lease.pk} does not cover this resource")
    return lease


def _check_capability(op: Operation, ctx: Fenced, policy: dict[str, Any], grounds: Grounds) -> None:
    held: list[CapabilityBudget] = []
    if ctx.run.n_capabilities > 0:  # while the run has asked for none there is nothing to read
        held = op.__dict__.pop(CAPABILITIES_SEEN, None)  # read by the fence's statement, once
        if held is None:
            found = sql_rows.select(CapabilityBudget, run_id=ctx.run.pk, tool=op.tool)
            held = [c for c in found if c.status != CapabilityStatus.DENIED]
    if not held and not policy["require_capability"]:
        return  # the policy does not ask for capabilities and the run holds none for this tool
    matching = [c for c in held if op.action in c.actions and op.resource in c.resources]
    if not matching:
        raise Denied("DENY_NO_CAPABILITY", f"the run holds no capability for {op.tool}.{op.action} on this resource")
    usable = [c for c in matching if c.status == CapabilityStatus.ACTIVE and c.expires_at > ctx.now]
    if not usable:
        pending = [c for c in matching if c.status == CapabilityStatus.PENDING_APPROVAL and c.expires_at > ctx.now]
        if pending:
            grounds.waiting_for = pending[0].approvals.order_by("-requested_at").first()
            grounds.needs_approval = True
            return
        raise Denied("DENY_EXPIRED", f"the run's capability for {op.tool} expired")
    need = op.payload_bytes or 0
    for capability in usable:
        if capability.used_calls < capability.max_calls and (
            capability.max_bytes is None or capability.used_bytes + need <= capability.max_bytes
        ):
            grounds.capability = capability
            return
    spent = "calls" if all(c.used_calls >= c.max_calls for c in usable) else "bytes"
    raise Denied("DENY_BUDGET", f"the run's capability for {op.tool} has no {spent} left", budget=f"capability:{spent}")


def reserve(*, op: Operation, ctx: Fenced, grounds: Grounds) -> CostReservation | None:
    """At dispatch: one call (and bytes) of the capability and the worst-case cost on every
    budget key, all or nothing (``cost_reserve``), then the approval, conditional: a
    refusal leaves nothing reserved. Returns the cost reservation (None: nothing to reserve)."""
    breaker = ctx.tenant.breaker if ctx.tenant is not None else None
    reservation = cost_reserve(
        op=op,
        run=ctx.run,
        policy=grounds.policy,
        batch=ctx.batch,
        actor=ctx.actor,
        now=ctx.now,
        capability=grounds.capability,
        fresh=True,
        breaker_seen=breaker,
    )
    if grounds.approval is not None:
        queues().approval_use(approval=grounds.approval, run=ctx.run, batch=ctx.batch, actor=ctx.actor)
    return reservation
