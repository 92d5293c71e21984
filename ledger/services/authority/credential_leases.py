"""Credential leases: one run borrows an exact scope of one credential version until the
lease expires or is revoked (article "Your AI Agent Needs a Credential Lease, Not a
Permanent API Key"). This module writes leases; the checks that read them at authorize
and dispatch (revoked, expired, stale version, action and resource) are in
``ledger.services.authority.evaluation``.

* **Issue** (worker, under the fence): ``ttl_s`` from 1 to 366 days (else 422); longer
  than the policy's ``max_ttl_s`` is the policy's refusal, 403 DENY_POLICY like a scope.
  ``actions`` and ``resources`` are non-empty lists of exact strings: no
  ``*`` (a lease scope is matched exactly; wildcards belong to policy rules), duplicates
  dropped. Every (action, resource) pair of the lease must be allowed by the tenant
  policy for at least one of the tools its rules name, with the policy's own
  first-rule-wins lookup (``ledger.policy.allows``): a credential is not bound to a
  tool, but a lease may not grant a pair that no tool could be allowed to use. A scope
  the policy refuses, and a principal the tenant does not have, are 403 DENY_POLICY
  (never 404), recorded as CREDENTIAL_LEASE_DENIED in the run's chain; a granted lease is
  CREDENTIAL_LEASE_ISSUED. A stale token is 409 STALE_TOKEN before anything else is
  decided. A QUARANTINED or STOPPED worker gets no credential (409 WORKER_NOT_ACCEPTING);
  a DRAINING one may still finish its work.
* **Revoke** (admin): a conditional UPDATE ``WHERE revoked_at IS NULL`` (one statement for
  a bulk revocation) and one CREDENTIAL_LEASE_REVOKED event per revoked lease in its run's
  chain. Revoking twice changes nothing and writes nothing. A single lease is revoked by
  id even if it has expired; the bulk forms (by principal, by lease-id prefix of at least
  four hex digits) take the *active* leases (unrevoked and unexpired): an expired lease
  can no longer be used, and revoking it would only add noise to finished runs' chains.

The lock order is the one of ``ledger.services.authority.credentials``.
"""

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from ledger.actors import user_actor
from ledger.boundary import check_text
from ledger.errors import Denied, InvalidInput, StaleToken, WorkerNotAccepting
from ledger.models import Credential, CredentialLease, Run, Tenant, Worker
from ledger.policy import allows
from ledger.roles import ADMINISTER
from ledger.services.authority.credentials import human_decision, principal_check
from ledger.services.authority.policy import policy_current
from ledger.services.core.decisions import acting_name, admin_action_record
from ledger.services.core.fencing import Fenced, fenced, locked_runs, refuse_new_work
from ledger.services.evidence.append import ChainBatch
from ledger.sql import credentials as sql_credentials
from ledger.states import WorkerStatus

MAX_ACTION_LENGTH = 100  # as Operation.action
MAX_RESOURCE_LENGTH = 500  # as Operation.resource
MAX_LEASE_ACTIONS = 50  # as a capability request
MAX_LEASE_RESOURCES = 50
# An absolute ceiling under any policy's max_ttl_s, so an expiry is always a valid date.
MAX_LEASE_TTL_S = 366 * 86400

DENIED_DETAIL = "the tenant policy does not allow this credential lease"


# --- checks -------------------------------------------------------------------------------


def _scope(values: object, *, name: str, max_items: int, max_length: int) -> list[str]:
    """A lease scope: a non-empty list of exact strings, duplicates dropped, order kept."""
    if not isinstance(values, list | tuple) or not values:
        raise InvalidInput(f"{name} must be a non-empty list of strings")
    if len(values) > max_items:
        raise InvalidInput(f"{name} may hold at most {max_items} entries")
    for index, value in enumerate(values):
        if not isinstance(value, str) or not 1 <= len(value) <= max_length:
            raise InvalidInput(f"{name}.{index} must be a string of 1 to {max_length} characters")
        check_text(value, path=f"{name}.{index}")
        if "*" in value:
            raise InvalidInput(f"{name}.{index}: a lease scope is exact; wildcards are not allowed")
    return list(dict.fromkeys(values))


def scope_refusal(policy: dict[str, Any], *, actions: list[str], resources: list[str]) -> str | None:
    """None when the policy allows every (action, resource) pair for some tool its rules
    name (first rule naming the tool wins, as everywhere); else which pair it refuses, by
    position (a detail never echoes what the caller sent)."""
    tools = list(dict.fromkeys(rule["tool"] for rule in policy["rules"]))
    for i, action in enumerate(actions):
        for j, resource in enumerate(resources):
            if not any(allows(policy, tool=tool, action=action, resource=resource) is None for tool in tools):
                return f"the tenant policy allows no tool actions.{i} on resources.{j}"
    return None


def _ttl(ttl_s: object) -> int:
    if type(ttl_s) is not int or not 1 <= ttl_s <= MAX_LEASE_TTL_S:
        raise InvalidInput(f"ttl_s must be an integer from 1 to {MAX_LEASE_TTL_S}", field="ttl_s")
    return ttl_s


def ttl_refusal(policy: dict[str, Any], ttl_s: int) -> str | None:
    """Why the policy refuses a lease this long, or None (a policy decision: 403, not 422)."""
    if ttl_s > policy["max_ttl_s"]:
        return f"ttl_s is longer than the tenant policy's max_ttl_s ({policy['max_ttl_s']} s)"
    return None


# --- issue --------------------------------------------------------------------------------


def credential_lease_issue(
    *,
    worker: Worker,
    run_id: object,
    fencing_token: int,
    principal: str,
    actions: list[str],
    resources: list[str],
    ttl_s: int,
) -> CredentialLease:
    """Lend the run ``principal``'s current version for ``actions`` x ``resources`` until
    now + ``ttl_s``. See the module docstring for the rules."""
    principal = principal_check(principal)
    ttl_s = _ttl(ttl_s)
    actions = _scope(actions, name="actions", max_items=MAX_LEASE_ACTIONS, max_length=MAX_ACTION_LENGTH)
    resources = _scope(resources, name="resources", max_items=MAX_LEASE_RESOURCES, max_length=MAX_RESOURCE_LENGTH)
    if worker.status in (WorkerStatus.QUARANTINED, WorkerStatus.STOPPED):
        raise WorkerNotAccepting(f"worker is {worker.status} and gets no credentials")
    tenant = worker.tenant
    refused: StaleToken | None = None
    with transaction.atomic():
        policy_version, policy = policy_current(tenant=tenant)
        # Locked FOR SHARE: a rotation waits for this issue (and then sees its lease), or
        # this issue for the rotation (and then reads the new version).
        credential = sql_credentials.credential_for_share(tenant_id=tenant.pk, principal=principal)
        denial = ttl_refusal(policy, ttl_s) or scope_refusal(policy, actions=actions, resources=resources)
        if credential is None and denial is None:
            denial = DENIED_DETAIL  # an unknown principal is a policy refusal, not a 404
        issue = _Issue(
            tenant=tenant,
            credential=credential if denial is None else None,  # refused: no lease, its denial recorded
            principal=principal,
            actions=actions,
            resources=resources,
            ttl_s=ttl_s,
            policy_version=policy_version,
        )
        try:
            lease = fenced(
                worker=worker,
                run_id=run_id,
                fencing_token=fencing_token,
                attempted="credential_lease.issue",
                write=issue.write,
            )
        except StaleToken as exc:
            refused = exc  # its STALE_TOKEN_REJECTED record commits with this transaction
    if refused is not None:
        raise refused
    if lease is None:  # the write issues no lease only when there is a denial
        raise Denied("DENY_POLICY", denial or DENIED_DETAIL)
    return lease


@dataclass(frozen=True)
class _Issue:
    """A lease to issue under the fence, of ``credential``; None: refused."""

    tenant: Tenant
    credential: Credential | None
    principal: str
    actions: list[str]
    resources: list[str]
    ttl_s: int
    policy_version: int

    def write(self, ctx: Fenced) -> CredentialLease | None:
        """The lease and its CREDENTIAL_LEASE_ISSUED event; without a credential, the
        CREDENTIAL_LEASE_DENIED event and no lease."""
        refuse_new_work(ctx.run)
        if self.credential is None:
            ctx.batch.append(
                ctx.run,
                "CREDENTIAL_LEASE_DENIED",
                actor=ctx.actor,
                fields={
                    "decision": "DENY_POLICY",
                    "principal": self.principal,
                    "actions": self.actions,
                    "resources": self.resources,
                    "policy_version": self.policy_version,
                },
            )
            return None
        lease = CredentialLease.objects.create(
            tenant=self.tenant,
            run=ctx.run,
            credential=self.credential,
            version=self.credential.version,
            actions=self.actions,
            resources=self.resources,
            issued_at=ctx.now,
            expires_at=ctx.now + timedelta(seconds=self.ttl_s),
        )
        ctx.batch.append(
            ctx.run,
            "CREDENTIAL_LEASE_ISSUED",
            actor=ctx.actor,
            fields={
                "lease_id": lease.pk,
                "principal": self.principal,
                "version": lease.version,
                "actions": self.actions,
                "resources": self.resources,
                "expires_at": lease.expires_at,
                "policy_version": self.policy_version,
            },
        )
        return lease


# --- find and revoke ------------------------------------------------------------------------


def _revoke(
    leases: QuerySet[CredentialLease], *, tenant: Tenant, revoked_by: str, reason: str
) -> list[CredentialLease]:
    """Revoke the still-unrevoked leases of ``leases``: lock their runs, then the lease
    rows, one UPDATE, one event per lease in its run's chain, all in one transaction."""
    revoked_by, reason = human_decision(revoked_by, reason)
    with transaction.atomic():
        now = timezone.now()
        run_ids = list(leases.order_by().values_list("run_id", flat=True).distinct())
        if not run_ids:
            return []
        runs = {run.pk: run for run in locked_runs({"run__tenant": tenant, "run_id__in": run_ids})}
        # Every revocation locks the lease's run first, so under these locks nobody else
        # revokes these leases; the fresh read below sees what is still unrevoked.
        targets = list(
            leases.filter(run_id__in=list(runs), revoked_at__isnull=True)
            .select_for_update(of=("self",))
            .order_by("issued_at", "id")
        )
        if not targets:
            return []
        count = CredentialLease.objects.filter(pk__in=[lease.pk for lease in targets], revoked_at__isnull=True).update(
            revoked_at=now, revoked_by=revoked_by, revoke_reason=reason
        )
        if count != len(targets):
            raise AssertionError("lease rows are locked; the UPDATE must see all of them")
        batch = ChainBatch(now)
        for lease in targets:
            lease.revoked_at, lease.revoked_by, lease.revoke_reason = now, revoked_by, reason
            batch.append(
                runs[lease.run_id],
                "CREDENTIAL_LEASE_REVOKED",
                actor=user_actor(revoked_by),
                fields={"lease_id": lease.pk, "principal": lease.credential.principal, "reason": reason},
            )
        batch.commit()
        principals = sorted({lease.credential.principal for lease in targets})
        admin_action_record(
            tenant=tenant,
            actor=user_actor(revoked_by),
            action="credential_lease.revoke",
            subject=f"{len(targets)} lease(s) of {', '.join(principals)}",
            reason=reason,
            fields={"lease_ids": [str(lease.pk) for lease in targets[:100]], "runs": len(runs)},
            now=now,
        )
    return targets


@dataclass(frozen=True)
class LeaseRevocation:
    """One lease after a revocation, and whether this call revoked it (False: it already was)."""

    lease: CredentialLease
    revoked_now: bool


def credential_lease_revoke(
    *,
    tenant: Tenant,
    lease_id: object,
    reason: str,
    revoked_by: str = "",
    user: User | AnonymousUser | None = None,
) -> LeaseRevocation:
    """Revoke one lease (even an expired one). Revoking a revoked lease changes nothing
    and returns it as it is. ``revoked_now`` on the result says whether this call did it.
    Given a console ``user``, their admin role on the tenant is checked and they are named."""
    revoked_by = acting_name(user=user, name=revoked_by, tenant_id=tenant.pk, perm=ADMINISTER)
    human_decision(revoked_by, reason)  # refuse a bad decision before looking anything up
    lease = CredentialLease.objects.of_tenant(tenant, lease_id)
    revoked = _revoke(
        CredentialLease.objects.filter(tenant=tenant, pk=lease.pk).select_related("credential"),
        tenant=tenant,
        revoked_by=revoked_by,
        reason=reason,
    )
    result = revoked[0] if revoked else CredentialLease.objects.of_tenant(tenant, lease.pk)
    return LeaseRevocation(lease=result, revoked_now=bool(revoked))


def credential_leases_revoke(
    *,
    tenant: Tenant,
    principal: str | None = None,
    prefix: str | None = None,
    reason: str,
    revoked_by: str = "",
    user: User | AnonymousUser | None = None,
) -> list[CredentialLease]:
    """Revoke every active lease of ``tenant`` that ``principal`` and/or ``prefix`` name
    (``CredentialLeaseQuerySet.revocable``, what the console and ``--dry-run`` preview);
    returns them."""
    revoked_by = acting_name(user=user, name=revoked_by, tenant_id=tenant.pk, perm=ADMINISTER)
    human_decision(revoked_by, reason)  # refuse a bad decision before looking anything up
    leases = CredentialLease.objects.revocable(tenant=tenant, principal=principal, prefix=prefix)
    return _revoke(leases, tenant=tenant, revoked_by=revoked_by, reason=reason)


def credential_leases_end_with_run(*, run: Run, batch: ChainBatch, actor: str, reason: str = "run ended") -> int:
    """A run that ends revokes its active credential leases (article flow 5: after the
    terminal status, before the resources), one CREDENTIAL_LEASE_REVOKED event each; so
    does a restore (``reason`` "restore"), for every lease alive in the restored database.
    The run is locked by the caller; an expired lease is left as it is: its expiry never
    waited for anything."""
    leases = list(
        CredentialLease.objects.filter(run=run, revoked_at__isnull=True, expires_at__gt=batch.now).select_related(
            "credential"
        )
    )
    if not leases:
        return 0
    CredentialLease.objects.filter(pk__in=[lease.pk for lease in leases], revoked_at__isnull=True).update(
        revoked_at=batch.now, revoked_by=actor, revoke_reason=reason
    )
    for lease in leases:
        batch.append(
            run,
            "CREDENTIAL_LEASE_REVOKED",
            actor=actor,
            fields={"lease_id": lease.pk, "principal": lease.credential.principal, "reason": reason},
        )
    return len(leases)
