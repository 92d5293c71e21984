"""Tenant policy versions: the starter version at tenant creation, and changes by admins.
Every change is a new immutable version; decisions record the version they were made under.

Every change goes through ``policy_change``: a whole document (the console's editor),
a file applied as code (``policy_apply``, with ``policy_diff`` saying what changes; the
``policy`` command), or one tool contract or the unknown-tool class (``contract_put``,
``contract_remove``, ``unknown_tool_class_set``; the console's contracts section)."""

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.db.models import F

from ledger.actors import SYSTEM, user_actor
from ledger.errors import InvalidInput, NotFound
from ledger.models import Tenant, TenantPolicy
from ledger.policy import (
    UNKNOWN_TOOL_CLASSES,
    completed_policy,
    contracts_of,
    starter_policy,
    unknown_tool_class_of,
    validate_contract,
    validate_policy,
)
from ledger.roles import ADMINISTER
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.core.fencing import TenantSeen
from ledger.services.core.policy_documents import policy_document


def policy_create_starter(*, tenant: Tenant) -> TenantPolicy:
    return TenantPolicy.objects.create(
        tenant=tenant, version=1, document=starter_policy(), created_by=SYSTEM, reason="starter policy"
    )


def policy_current(*, tenant: Tenant) -> tuple[int, dict[str, Any]]:
    """(version, document) of the tenant's current policy, read fresh."""
    current = Tenant.objects.filter(pk=tenant.pk).values("policy_version")[:1]
    return TenantPolicy.objects.filter(tenant=tenant, version=current).values_list("version", "document").get()


@dataclass(frozen=True)
class PolicyNow:
    """What a decision reads of its tenant: the current policy version with its document
    (shared: read it, never change it) and the breaker as stored."""

    version: int
    document: dict[str, Any]
    breaker: tuple[str, str, datetime | None]


def policy_now(*, tenant: Tenant, seen: TenantSeen | None = None) -> PolicyNow:
    """The tenant's current policy and breaker: as the fence's locking statement ``seen``
    them, or else read fresh from the tenant row. The document of a version is read once per
    process (``policy_documents``)."""
    if seen is None:
        seen = TenantSeen.from_row(
            Tenant.objects.filter(pk=tenant.pk)
            .values_list("policy_version", "breaker_state", "breaker_reason", "breaker_changed_at")
            .get()
        )
    return PolicyNow(
        version=seen.policy_version,
        document=policy_document(tenant, seen.policy_version),
        breaker=seen.breaker,
    )


@transaction.atomic
def policy_change(
    *,
    tenant: Tenant,
    document: dict[str, Any],
    reason: str,
    changed_by: str = "",
    user: User | AnonymousUser | None = None,
) -> TenantPolicy:
    """A new policy version, made current. Who made it and why are required; given a
    console ``user``, their admin role on the tenant is checked and they are named."""
    changed_by = acting_name(user=user, name=changed_by, tenant_id=tenant.pk, perm=ADMINISTER)
    if not changed_by:
        raise InvalidInput("a policy change names who made it and why")
    reason = decision_reason(reason)
    validated = validate_policy(document, reconcilers=configured_reconcilers())
    locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
    version = locked.policy_version + 1
    row = TenantPolicy.objects.create(
        tenant=locked, version=version, document=validated, created_by=changed_by, reason=reason
    )
    Tenant.objects.filter(pk=locked.pk).update(policy_version=F("policy_version") + 1)
    admin_action_record(
        tenant=locked,
        actor=user_actor(changed_by),
        action="policy.change",
        subject=f"version {version}",
        reason=reason,
        now=row.created_at,
    )
    tenant.policy_version = version
    return row


def configured_reconcilers() -> Collection[str]:
    """The reconciler names a contract may give (``settings.FENCELINE["RECONCILERS"]``)."""
    reconcilers: dict[str, dict[str, Any]] = settings.FENCELINE.get("RECONCILERS", {})
    return reconcilers.keys()


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def policy_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changes from ``old`` to ``new``, one line per path, both read with today's keys:
    ``~ policy.max_ttl_s: 3600 -> 7200``, ``+ policy.tool_contracts.0: {...}``, ``- ...``.
    The ``starter`` marker is not a rule and is left out. Empty: nothing changes."""
    lines: list[str] = []

    def walk(path: str, a: Any, b: Any) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if key not in b:
                    lines.append(f"- {path}.{key}: {_shown(a[key])}")
                elif key not in a:
                    lines.append(f"+ {path}.{key}: {_shown(b[key])}")
                else:
                    walk(f"{path}.{key}", a[key], b[key])
        elif isinstance(a, list) and isinstance(b, list):
            for index in range(max(len(a), len(b))):
                if index >= len(b):
                    lines.append(f"- {path}.{index}: {_shown(a[index])}")
                elif index >= len(a):
                    lines.append(f"+ {path}.{index}: {_shown(b[index])}")
                else:
                    walk(f"{path}.{index}", a[index], b[index])
        elif a != b or type(a) is not type(b):
            lines.append(f"~ {path}: {_shown(a)} -> {_shown(b)}")

    old_doc, new_doc = completed_policy(old), completed_policy(new)
    old_doc.pop("starter", None)
    new_doc.pop("starter", None)
    walk("policy", old_doc, new_doc)
    return lines


def policy_export(*, tenant: Tenant) -> dict[str, Any]:
    """The tenant's current policy as a file ``policy_apply`` takes back: {policy, version}."""
    version, document = policy_current(tenant=tenant)
    return {"policy": document, "version": version}


EXPORT_KEYS = {"policy", "version"}


def policy_from_file(data: object) -> dict[str, Any]:
    """The document in a file to apply: an export ({policy, version}; the version is where
    it came from, not a condition) or a bare policy document."""
    if isinstance(data, dict) and "policy" in data:
        unknown = sorted(set(data) - EXPORT_KEYS)
        if unknown:
            raise InvalidInput(f"{unknown[0]} is not a field of an exported policy (policy, version)", field=unknown[0])
        data = data["policy"]
    if not isinstance(data, dict):
        raise InvalidInput("policy must be a JSON object", field="policy")
    return data


@dataclass(frozen=True)
class PolicyApply:
    diff: list[str]  # what changes (empty: nothing)
    version: int  # the version now current (the new one when ``created``)
    created: bool  # a new version was written


@transaction.atomic
def policy_apply(
    *,
    tenant: Tenant,
    document: dict[str, Any],
    reason: str,
    changed_by: str = "",
    user: User | AnonymousUser | None = None,
    dry_run: bool = False,
) -> PolicyApply:
    """Make ``document`` the tenant's policy: a new version through ``policy_change`` when it
    differs from the current one, nothing when it does not (applying twice is applying
    once), nothing either on a dry run. An invalid document changes nothing."""
    validated = validate_policy(document, reconcilers=configured_reconcilers())
    Tenant.objects.select_for_update().filter(pk=tenant.pk).values_list("pk").get()  # one change at a time
    version, current = policy_current(tenant=tenant)
    diff = policy_diff(current, validated)
    if not diff or dry_run:
        return PolicyApply(diff=diff, version=version, created=False)
    row = policy_change(tenant=tenant, document=validated, reason=reason, changed_by=changed_by, user=user)
    return PolicyApply(diff=diff, version=row.version, created=True)


def _policy_next(
    *,
    tenant: Tenant,
    build: Callable[[dict[str, Any]], dict[str, Any]],
    reason: str,
    changed_by: str,
    user: User | AnonymousUser | None,
) -> TenantPolicy:
    """The next version: ``build`` makes it from the current document (read under the
    tenant's lock); a change that changes nothing is refused."""
    Tenant.objects.select_for_update().filter(pk=tenant.pk).values_list("pk").get()
    _, current = policy_current(tenant=tenant)
    current = completed_policy(current)
    document = build(current)
    if not policy_diff(current, document):
        raise InvalidInput("nothing changes: the policy already says this")
    return policy_change(tenant=tenant, document=document, reason=reason, changed_by=changed_by, user=user)


@transaction.atomic
def contract_put(
    *,
    tenant: Tenant,
    contract: dict[str, Any],
    reason: str,
    changed_by: str = "",
    user: User | AnonymousUser | None = None,
) -> tuple[TenantPolicy, bool]:
    """Add a tool contract, or replace the one for the same (tool, action): a new policy
    version. Returns (the version, whether one was replaced). Refusals name the contract's
    field (``contract.effect_class``)."""
    checked = validate_contract(contract, reconcilers=configured_reconcilers())
    replaced = False

    def build(current: dict[str, Any]) -> dict[str, Any]:
        nonlocal replaced
        contracts = contracts_of(current)
        for index, existing in enumerate(contracts):
            if (existing["tool"], existing["action"]) == (checked["tool"], checked["action"]):
                contracts[index], replaced = checked, True
                break
        else:
            contracts.append(checked)
        return {**current, "tool_contracts": contracts}

    row = _policy_next(tenant=tenant, build=build, reason=reason, changed_by=changed_by, user=user)
    return row, replaced


@transaction.atomic
def contract_remove(
    *,
    tenant: Tenant,
    tool: str,
    action: str,
    reason: str,
    changed_by: str = "",
    user: User | AnonymousUser | None = None,
) -> TenantPolicy:
    """Remove the contract for (tool, action): a new policy version; NotFound without one."""

    def build(current: dict[str, Any]) -> dict[str, Any]:
        contracts = contracts_of(current)
        kept = [c for c in contracts if (c["tool"], c["action"]) != (tool, action)]
        if len(kept) == len(contracts):
            raise NotFound(f"the policy has no contract for {tool}.{action}")
        return {**current, "tool_contracts": kept}

    return _policy_next(tenant=tenant, build=build, reason=reason, changed_by=changed_by, user=user)


@transaction.atomic
def unknown_tool_class_set(
    *,
    tenant: Tenant,
    value: str,
    reason: str,
    changed_by: str = "",
    user: User | AnonymousUser | None = None,
) -> TenantPolicy:
    """What a tool without a contract is taken as (``UNKNOWN_TOOL_CLASSES``): a new version."""
    if value not in UNKNOWN_TOOL_CLASSES:
        raise InvalidInput(
            f"unknown_tool_class must be one of {', '.join(UNKNOWN_TOOL_CLASSES)}", field="unknown_tool_class"
        )

    def build(current: dict[str, Any]) -> dict[str, Any]:
        if unknown_tool_class_of(current) == value:
            raise InvalidInput(f"nothing changes: unknown tools are already {value}", field="unknown_tool_class")
        return {**current, "unknown_tool_class": value}

    return _policy_next(tenant=tenant, build=build, reason=reason, changed_by=changed_by, user=user)
