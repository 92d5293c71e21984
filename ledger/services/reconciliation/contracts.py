"""Tool contracts at intent: what an operation *is* comes from the tenant's contract for its
tool (and action), not from the worker's label (policy document: ``tool_contracts`` and
``unknown_tool_class``, see ``ledger/policy.py``).

    contract found      its effect_class (a different declared one: EFFECT_CLASS_MISMATCH),
                        its provider, at least its worst-case cost, its reconciler
    no contract         the policy's unknown_tool_class: WORKER_DECLARED (the starter's: the
                        declared class is taken, as before contracts), REFUSE (403
                        DENY_POLICY), or a class imposed like a contract's

The reconciler an UNKNOWN of the operation will be looked up with is chosen here too: the
contract's, else the one registered for the operation's provider (``registry``).
"""

from dataclasses import replace
from typing import Any

from ledger.errors import Denied, EffectClassMismatch, InvalidInput
from ledger.models import Tenant
from ledger.policy import contract_for, unknown_tool_class_of
from ledger.services.core.intent import Intent
from ledger.services.core.policy_documents import policy_document, policy_document_digest
from ledger.services.reconciliation.registry import reconciler_for_provider
from ledger.states import EffectClass

WORKER_DECLARED = "WORKER_DECLARED"
REFUSE = "REFUSE"


def policy_in_force(tenant: Tenant) -> tuple[int, dict[str, Any]]:
    """(version, document) of ``tenant.policy_version`` as loaded with the caller's row."""
    return tenant.policy_version, policy_document(tenant, tenant.policy_version)


def policy_digest_of(tenant: Tenant, version: int | None = None) -> tuple[int, str]:
    """(version, digest) of the tenant's policy ``version`` (default: as loaded), for a
    decision to record what it was made under."""
    version = tenant.policy_version if version is None else version
    return version, policy_document_digest(tenant, version)


def decision_policy(tenant: Tenant, version: int | None = None) -> dict[str, Any]:
    """The event fields a decision records of the policy it was made under."""
    version, digest = policy_digest_of(tenant, version)
    return {"policy_version": version, "policy_digest": digest}


def intent_terms(*, tenant: Tenant, intent: Intent) -> tuple[Intent, str]:
    """The intent as the contract makes it, and the name of its reconciler ("" for none)."""
    _version, policy = policy_in_force(tenant)
    contract = contract_for(policy, intent.tool, intent.action)
    where = f"{intent.tool}.{intent.action}"
    if contract is None:
        rule = unknown_tool_class_of(policy)
        if rule == REFUSE:
            raise Denied("DENY_POLICY", f"no tool contract for {where}, and the policy refuses tools without one")
        if rule == WORKER_DECLARED:
            if intent.effect_class is None:
                raise InvalidInput(
                    f"effect_class is required: no tool contract for {where} gives it", field="effect_class"
                )
            return intent, reconciler_for_provider(intent.provider)
        imposed = EffectClass(rule)
        _check_declared(intent, imposed, f"the policy gives tools without a contract the class {imposed}")
        return replace(intent, effect_class=imposed), reconciler_for_provider(intent.provider)
    effect = EffectClass(contract["effect_class"])
    _check_declared(intent, effect, f"the tool contract for {where} says {effect}")
    provider = contract.get("provider") or ""
    if provider and intent.provider and intent.provider != provider:
        raise InvalidInput(f"provider: the tool contract for {where} says {provider!r}", field="provider")
    worst = contract.get("worst_case_cost_cents")
    estimate = intent.estimated_cost_cents
    if worst is not None:
        estimate = max(worst, estimate or 0)
    terms = replace(intent, effect_class=effect, provider=provider or intent.provider, estimated_cost_cents=estimate)
    return terms, contract.get("reconciler") or reconciler_for_provider(terms.provider)


def _check_declared(intent: Intent, effect: EffectClass, why: str) -> None:
    if intent.effect_class is not None and intent.effect_class != effect:
        raise EffectClassMismatch(
            f"effect_class {intent.effect_class} was declared, but {why}",
            field="effect_class",
            declared=str(intent.effect_class),
            contract=effect.value,
        )
