"""Capability budgets: a run-bound, expiring contract per tool — which actions on which
resources, how many calls and bytes — requested by the run's lease owner within the tenant
policy, and never wider than the parent run's."""

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import F

from ledger.errors import Denied, InvalidInput
from ledger.models import CapabilityBudget, Run, Worker
from ledger.policy import allows, needs_human
from ledger.services.authority.policy import policy_current
from ledger.services.core.fencing import Fenced, fenced, refuse_new_work
from ledger.services.core.handoff import Approval, queues
from ledger.services.evidence.append import ChainBatch
from ledger.states import ApprovalKind, CapabilityStatus


@dataclass(frozen=True)
class RequestedCapability:
    """A new capability budget and, when it waits for a person (PENDING_APPROVAL), the
    approval request it waits on."""

    capability: CapabilityBudget
    approval: Approval | None


def capability_request(
    *,
    worker: Worker,
    run_id: object,
    fencing_token: int,
    tool: str,
    actions: list[str],
    resources: list[str],
    max_calls: int,
    ttl_s: int,
    approval: str = "none",
    max_bytes: int | None = None,
) -> RequestedCapability:
    if approval not in ("none", "human"):
        raise InvalidInput("approval must be 'none' or 'human'")
    asked = _Asked(
        worker=worker,
        tool=tool,
        actions=actions,
        resources=resources,
        max_calls=max_calls,
        ttl_s=ttl_s,
        approval=approval,
        max_bytes=max_bytes,
    )
    return fenced(
        worker=worker, run_id=run_id, fencing_token=fencing_token, attempted="capability.request", write=asked.grant
    )


@dataclass(frozen=True)
class _Asked:
    """One capability a run's lease owner asks for, and its fenced write (:meth:`grant`)."""

    worker: Worker
    tool: str
    actions: list[str]
    resources: list[str]
    max_calls: int
    ttl_s: int
    approval: str
    max_bytes: int | None

    def grant(self, ctx: Fenced) -> RequestedCapability:
        """Within the tenant policy and the parent run's capabilities: ACTIVE, or
        PENDING_APPROVAL with the approval request it waits on when a person must decide."""
        refuse_new_work(ctx.run)
        version, policy = policy_current(tenant=self.worker.tenant)
        self._within_policy(policy)
        expires_at = ctx.now + timedelta(seconds=self.ttl_s)
        if ctx.run.parent_id is not None:
            parent = self._within_parent(ctx, parent_run_id=ctx.run.parent_id)
            expires_at = min(expires_at, parent.expires_at)  # never outlives what it came from
        human = self.approval == "human" or needs_human(policy, self.tool)
        capability = CapabilityBudget.objects.create(
            tenant=self.worker.tenant,
            run=ctx.run,
            tool=self.tool,
            actions=self.actions,
            resources=self.resources,
            max_calls=self.max_calls,
            max_bytes=self.max_bytes,
            expires_at=expires_at,
            approval="human" if human else "none",
            status=CapabilityStatus.PENDING_APPROVAL if human else CapabilityStatus.ACTIVE,
            policy_version=version,
        )
        ctx.run.n_capabilities += 1  # written with the chain head
        ctx.batch.append(
            ctx.run,
            "CAPABILITY_REQUESTED" if human else "CAPABILITY_GRANTED",
            actor=ctx.actor,
            fields={
                "capability_id": capability.pk,
                "tool": self.tool,
                "actions": self.actions,
                "resources": self.resources,
                "max_calls": self.max_calls,
                "max_bytes": self.max_bytes,
                "expires_at": expires_at,
                "policy_version": version,
            },
        )
        approval_request = None
        if human:
            approval_request = queues().approval_open(
                run=ctx.run,
                kind=ApprovalKind.CAPABILITY,
                fencing_token=ctx.fencing_token,
                ttl_s=policy["approval_ttl_s"],
                batch=ctx.batch,
                actor=ctx.actor,
                capability=capability,
            )
        return RequestedCapability(capability=capability, approval=approval_request)

    def _within_policy(self, policy: dict[str, Any]) -> None:
        if self.ttl_s > policy["max_ttl_s"]:
            raise Denied("DENY_POLICY", f"ttl_s may be at most {policy['max_ttl_s']} under the tenant policy")
        if self.max_calls > policy["max_calls"]:
            raise Denied("DENY_POLICY", f"max_calls may be at most {policy['max_calls']} under the tenant policy")
        if policy["max_bytes"] is not None and (self.max_bytes is None or self.max_bytes > policy["max_bytes"]):
            raise Denied(
                "DENY_POLICY", f"max_bytes must be set and at most {policy['max_bytes']} under the tenant policy"
            )
        for action in self.actions:
            for resource in self.resources:
                why = allows(policy, tool=self.tool, action=action, resource=resource)
                if why is not None:
                    raise Denied("DENY_POLICY", why)

    def _within_parent(self, ctx: Fenced, *, parent_run_id: uuid.UUID) -> CapabilityBudget:
        """A child run's capability must fit inside one ACTIVE capability of its parent, and the
        calls and bytes it gets are taken from the parent's (a conditional UPDATE), so the two
        together never hold more than the parent was granted."""
        parents = CapabilityBudget.objects.filter(run_id=parent_run_id, tool=self.tool, status=CapabilityStatus.ACTIVE)
        for parent in parents:
            fits = (
                set(self.actions) <= set(parent.actions)
                and set(self.resources) <= set(parent.resources)
                and (parent.max_bytes is None or self.max_bytes is not None)
                and parent.expires_at > ctx.now
            )
            if not fits:
                continue
            delegated = CapabilityBudget.objects.filter(
                pk=parent.pk,
                status=CapabilityStatus.ACTIVE,
                used_calls__lte=F("max_calls") - self.max_calls,
            )
            if parent.max_bytes is not None:
                delegated = delegated.filter(used_bytes__lte=F("max_bytes") - self.max_bytes)
            taken = delegated.update(
                used_calls=F("used_calls") + self.max_calls, used_bytes=F("used_bytes") + (self.max_bytes or 0)
            )
            if taken:
                return parent
        raise Denied("DENY_POLICY", f"wider than any capability the parent run holds for tool {self.tool!r}")


def capabilities_end_with_run(*, run: Run, batch: ChainBatch, actor: str) -> int:
    """A run that ends takes its unexpired capability budgets with it (they expire now),
    with one CAPABILITIES_REVOKED event. The run is locked by the caller."""
    ids = list(
        CapabilityBudget.objects.filter(run=run, expires_at__gt=batch.now)
        .exclude(status=CapabilityStatus.DENIED)
        .values_list("pk", flat=True)
    )
    if ids:
        CapabilityBudget.objects.filter(pk__in=ids).update(expires_at=batch.now)
        batch.append(
            run,
            "CAPABILITIES_REVOKED",
            actor=actor,
            fields={"capability_ids": [str(pk) for pk in ids], "reason": "run ended"},
        )
    return len(ids)
