"""Tenant policy documents: their shape, the starter policy, and pure questions about them.

A policy is a JSON document stored as one immutable TenantPolicy row per version. This
module only reads documents; ``ledger.services.policy`` stores and changes them.

    {
      "starter": true,                      # still on the starter policy (the console marks it)
      "rules": [                            # what may be requested: first rule naming the tool wins
        {"tool": "*", "actions": ["*"], "resources": ["*"]}
      ],
      "human_approval_tools": [],           # tools that always need a person's approval
      "require_credential": false,          # must authorize name a credential lease?
      "require_capability": false,          # must the run hold a capability for the tool?
      "max_ttl_s": 3600,                    # longest capability / credential lease
      "max_calls": 100,                     # most calls one capability may grant
      "max_bytes": null,                    # most bytes one capability may grant (null: no cap)
      "approval_ttl_s": 3600,               # how long an approval request stays answerable
      "cost_window_s": 86400,               # length of a cost window
      "cost_limits_cents": {                # null: no limit for that key
        "run": null, "tenant": null, "retry": null, "provider": {}
      },
      "reservation_ttl_s": 900,             # a reservation older than this becomes UNKNOWN
      "idle_limit_s": 900,                  # a renewal after this long without progress ends
                                            # the lease instead (null: no idle limit)
      "stuck_after_s": 900,                 # an ACTIVE run with no lease, or no progress, for
                                            # longer than this is flagged stuck in the console
                                            # and in /metrics (fenceline_stuck_runs)
      "max_runtime_s": 86400,               # a run older than this ends TIMED_OUT; a run may ask
                                            # for less at creation (null: no limit)
      "cancel_grace_s": 60,                 # after a cancel, how long DISPATCHED effects may
                                            # still report before they become UNKNOWN
      "restart_budget": {                   # boots in a restart episode before QUARANTINED
        "max_restarts": 5, "window_s": 600
      },
      "stale_token_limit": {                # stale-token rejections of one worker in a window
        "max_rejections": 50, "window_s": 60  # before it is told to stop and QUARANTINED
      },
      "case_timers": {                      # the reconciliation queue's timers: a claim not
        "ack_s": 1800, "escalate_s": 7200   # acted on within ack_s expires (back to OPEN); an
      },                                    # unclaimed case older than escalate_s is ESCALATED
      "runtime_audit": null,                # null: not enforced; else what a boot's container
                                            # self-audit must show to be admitted:
                                            # {"allow_root": false, "allowed_capabilities": [],
                                            #  "allow_host_control": false,
                                            #  "allow_sensitive_mounts": false,
                                            #  "allow_writable_root": false,      # optional
                                            #  "allow_new_privileges": false,     # optional
                                            #  "output_paths": ["/tmp", ...]}     # optional
                                            # (an optional key left out is not enforced)
      "admission": {                        # what a worker must have done to take a lease
        "boot_report_required": false       # a boot report from the worker (409 NOT_READY
      },                                    # naming it otherwise)
      "quotas": {                           # null (or a missing key): no limit
        "instances_per_tenant": null,       # live instances (held leases) of the tenant
        "instances_per_worker": null,       # ... held by one worker
        "instances_per_tool": {},           # ... per tool named at acquire, e.g. {"browser": 4}
        "resources_per_run": {},            # open resources per run and kind, e.g.
                                            # {"browser_session": 2}; "*" for any other kind
        "resource_max_age_s": 86400         # the longest a resource may live (its ttl_s cap)
      },
      "breaker": {                          # share of the tenant limit (reserved + settled)
        "throttled_at": 0.6, "degraded_at": 0.85, "open_at": 1.0,
        "throttled_max_dispatched": 2,      # in-flight operations allowed while THROTTLED
        "levers": {                         # optional: what a dispatch hands the worker while
          "THROTTLED": {                    # the breaker is THROTTLED or DEGRADED (each state
            "max_output_tokens": 1024,      # optional): an output ceiling (an integer >= 1,
            "fallbacks": ["small-model"]    # or null) and cheaper choices to use instead,
          },                                # best first (names, at most 16; default [])
          "DEGRADED": {"max_output_tokens": 256, "fallbacks": []}
        }
      },
      "retry_budget": {                     # what retries of one operation may take
        "automatic_attempts": 3,            # attempts before a retry needs a person
        "max_attempts": null,               # most attempts, even with approval (null: no cap)
        "max_cost_cents": null              # most cents its attempts may have cost before
      },                                    # another is refused (null: no cap)
      "tool_contracts": [                   # per tool (and action): what the effect is,
        {"tool": "payments",                # whatever the worker declares
         "action": "charge",                # "*" (the default): every action of the tool
         "effect_class": "NON_RETRYABLE",   # one of ledger.states.EffectClass
         "provider": "sandbox-payments",    # where the effect goes, or null (the default)
         "reconciler": "sandbox-payments",  # null (the default), or a reconciler configured
                                            # in settings.FENCELINE["RECONCILERS"]
         "worst_case_cost_cents": 5000,     # an integer >= 0, or null (the default)
         "human_approval": false}           # a person approves every operation of it
      ],                                    # (the starter's: []); (tool, action) unique
      "unknown_tool_class": "WORKER_DECLARED", # a tool with no contract: "WORKER_DECLARED"
                                            # (the starter's: the worker's declared class is
                                            # taken), "REFUSE", or an EffectClass imposed
      "concurrency": {                      # flow control at dispatch: most DISPATCHED at once
        "tenant": 20, "tool:email": 4       # per key (an integer >= 1); the starter's: {}
      },
      "rate_limits": {                      # token buckets: per_s (a number > 0) refilled,
        "provider:stripe": {"per_s": 5, "burst": 10}  # burst (an integer >= 1) at most
      }                                     # (the starter's: {})
    }

A flow key is ``tenant``, ``tool:<name>``, ``provider:<name>``, ``key:<flow_key>`` (the
operation's intent names it) or ``key:*`` (one limit for each distinct flow_key value; a
``key:<value>`` entry wins over it). See ``ledger.services.authority.flow``.

A contract names its tool exactly (``contract_for``: the exact action's contract, else the
tool's "*" one). A policy stored before a key existed reads as the starter's
(``quotas_of``, ``contracts_of``, ``unknown_tool_class_of``).

Patterns in rules use shell-style wildcards (``repo:acme/*``). Capability and credential
scopes are matched exactly at dispatch; policy rules bound what may be requested.
"""

import copy
import hashlib
import json
from collections.abc import Collection
from fnmatch import fnmatchcase
from typing import Any

from ledger.errors import InvalidInput
from ledger.states import EffectClass

# A policy document, a tool contract, a rule: JSON objects of the shapes above.
type PolicyDocument = dict[str, Any]
type ToolContract = dict[str, Any]

# What a tool without a contract is taken as: the worker's declared class (the starter's),
# refused outright, or one side-effect class imposed on every such tool.
WORKER_DECLARED = "WORKER_DECLARED"
REFUSE = "REFUSE"
UNKNOWN_TOOL_CLASSES: tuple[str, ...] = (WORKER_DECLARED, REFUSE, *EffectClass.values)

# A contract's optional keys and what a missing one means.
CONTRACT_DEFAULTS: ToolContract = {
    "action": "*",
    "provider": None,
    "reconciler": None,
    "worst_case_cost_cents": None,
    "human_approval": False,
}
CONTRACT_KEYS: tuple[str, ...] = ("tool", "action", "effect_class", *tuple(CONTRACT_DEFAULTS)[1:])

STARTER_POLICY: PolicyDocument = {
    "starter": True,
    "rules": [{"tool": "*", "actions": ["*"], "resources": ["*"]}],
    "human_approval_tools": [],
    "require_credential": False,
    "require_capability": False,
    "max_ttl_s": 3600,
    "max_calls": 100,
    "max_bytes": None,
    "approval_ttl_s": 3600,
    "cost_window_s": 86400,
    "cost_limits_cents": {"run": None, "tenant": None, "retry": None, "provider": {}},
    "reservation_ttl_s": 900,
    "idle_limit_s": 900,
    "stuck_after_s": 900,
    "max_runtime_s": 86400,
    "cancel_grace_s": 60,
    "restart_budget": {"max_restarts": 5, "window_s": 600},
    "stale_token_limit": {"max_rejections": 50, "window_s": 60},
    "case_timers": {"ack_s": 1800, "escalate_s": 7200},
    "runtime_audit": None,
    "admission": {"boot_report_required": False},
    "quotas": {
        "instances_per_tenant": None,
        "instances_per_worker": None,
        "instances_per_tool": {},
        "resources_per_run": {},
        "resource_max_age_s": 86400,
    },
    "breaker": {"throttled_at": 0.6, "degraded_at": 0.85, "open_at": 1.0, "throttled_max_dispatched": 2},
    "retry_budget": {"automatic_attempts": 3, "max_attempts": None, "max_cost_cents": None},
    "tool_contracts": [],
    "unknown_tool_class": WORKER_DECLARED,
    "concurrency": {},
    "rate_limits": {},
}


def stuck_after_s_of(document: PolicyDocument) -> int:
    """How long an ACTIVE run may go without a lease or progress before it is flagged stuck
    (a policy stored before the key existed: the starter's)."""
    value = document.get("stuck_after_s")
    return value if type(value) is int and value > 0 else int(STARTER_POLICY["stuck_after_s"])


def starter_policy() -> PolicyDocument:
    return copy.deepcopy(STARTER_POLICY)


def _invalid(path: str, problem: str) -> InvalidInput:
    """The refusal of the value at ``path``: the message starts with the path, and the
    error carries it as its field."""
    return InvalidInput(f"{path}{'' if problem.startswith(':') else ' '}{problem}", field=path)


def _positive_int(document: PolicyDocument, name: str, *, nullable: bool = False) -> None:
    value = document.get(name)
    if value is None and nullable:
        return
    if type(value) is not int or value < 1:
        raise _invalid(f"policy.{name}", f"must be a positive integer{' or null' if nullable else ''}")


def _strings(value: object, path: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _invalid(path, "must be a non-empty list of strings")
    return value


def validate_policy(document: object, *, reconcilers: Collection[str] | None = None) -> PolicyDocument:
    """The document completed with the starter defaults, or InvalidInput naming the field
    (its ``field`` is the path, e.g. ``policy.tool_contracts.2.effect_class``). Given
    ``reconcilers`` (the configured names), a contract's reconciler must be one of them."""
    if not isinstance(document, dict):
        raise _invalid("policy", "must be a JSON object")
    unknown = sorted(set(document) - set(STARTER_POLICY))
    if unknown:
        raise _invalid(f"policy.{unknown[0]}", f"is not a policy field (unknown: {', '.join(unknown)})")
    merged = {**starter_policy(), **copy.deepcopy(document), "starter": False}
    _validate_rules(merged["rules"])
    _validate_scalars(merged)
    _validate_cost_limits(merged["cost_limits_cents"])
    _validate_quotas(merged)
    _validate_window(merged, "restart_budget", "max_restarts")
    _validate_window(merged, "stale_token_limit", "max_rejections")
    _validate_case_timers(merged["case_timers"])
    _validate_runtime_audit(merged["runtime_audit"])
    _validate_admission(merged["admission"])
    _validate_breaker(merged["breaker"])
    _validate_retry_budget(merged)
    merged["tool_contracts"] = _validate_contracts(merged["tool_contracts"], reconcilers)
    _validate_flow(merged["concurrency"], merged["rate_limits"])
    if merged["unknown_tool_class"] not in UNKNOWN_TOOL_CLASSES:
        raise _invalid("policy.unknown_tool_class", f"must be one of {', '.join(UNKNOWN_TOOL_CLASSES)}")
    return merged


def _validate_rules(rules: object) -> None:
    if not isinstance(rules, list):
        raise _invalid("policy.rules", "must be a list")
    for index, rule in enumerate(rules):
        if (
            not isinstance(rule, dict)
            or set(rule) != {"tool", "actions", "resources"}
            or not isinstance(rule["tool"], str)
        ):
            raise _invalid(f"policy.rules.{index}", "must be {tool, actions, resources}")
        _strings(rule["actions"], f"policy.rules.{index}.actions")
        _strings(rule["resources"], f"policy.rules.{index}.resources")


def _validate_scalars(merged: PolicyDocument) -> None:
    """The approval tools, the two flags, and the durations and counts."""
    if not isinstance(merged["human_approval_tools"], list):
        raise _invalid("policy.human_approval_tools", "must be a list of tool names")
    for flag in ("require_credential", "require_capability"):
        if not isinstance(merged[flag], bool):
            raise _invalid(f"policy.{flag}", "must be true or false")
    for name in (
        "max_ttl_s",
        "max_calls",
        "approval_ttl_s",
        "cost_window_s",
        "reservation_ttl_s",
        "cancel_grace_s",
        "stuck_after_s",
    ):
        _positive_int(merged, name)
    for name in ("max_bytes", "idle_limit_s", "max_runtime_s"):
        _positive_int(merged, name, nullable=True)


def _validate_cost_limits(limits: object) -> None:
    if not isinstance(limits, dict) or set(limits) != {"run", "tenant", "retry", "provider"}:
        raise _invalid("policy.cost_limits_cents", "must have run, tenant, retry and provider")
    for key in ("run", "tenant", "retry"):
        if limits[key] is not None and (type(limits[key]) is not int or limits[key] < 0):
            raise _invalid(f"policy.cost_limits_cents.{key}", "must be cents (an integer >= 0) or null")
    if not isinstance(limits["provider"], dict) or any(
        type(v) is not int or v < 0 for v in limits["provider"].values()
    ):
        raise _invalid("policy.cost_limits_cents.provider", "must map provider names to cents")


# The breaker states that hand the worker levers on dispatch, and a lever's keys.
LEVER_STATES = ("THROTTLED", "DEGRADED")
LEVER_DEFAULTS: dict[str, Any] = {"max_output_tokens": None, "fallbacks": []}
MAX_FALLBACKS = 16
FALLBACK_NAME_MAX = 100


def _validate_breaker(breaker: object) -> None:
    required = set(STARTER_POLICY["breaker"])
    if not isinstance(breaker, dict) or not required <= set(breaker) <= {*required, "levers"}:
        raise _invalid(
            "policy.breaker",
            "must have throttled_at, degraded_at, open_at, throttled_max_dispatched (and may have levers)",
        )
    shares = [breaker["throttled_at"], breaker["degraded_at"], breaker["open_at"]]
    if (
        not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in shares)
        or not 0 < shares[0] <= shares[1] <= shares[2] <= 1
    ):
        raise _invalid("policy.breaker", "thresholds must satisfy 0 < throttled_at <= degraded_at <= open_at <= 1")
    if type(breaker["throttled_max_dispatched"]) is not int or breaker["throttled_max_dispatched"] < 1:
        raise _invalid("policy.breaker.throttled_max_dispatched", "must be a positive integer")
    if "levers" in breaker:
        breaker["levers"] = _validate_levers(breaker["levers"])


def _validate_levers(levers: object) -> dict[str, dict[str, Any]]:
    """``breaker.levers`` completed with each lever's defaults, or InvalidInput naming the key."""
    if not isinstance(levers, dict):
        raise _invalid("policy.breaker.levers", f"must map {' / '.join(LEVER_STATES)} to levers")
    completed: dict[str, dict[str, Any]] = {}
    for state, lever in levers.items():
        path = f"policy.breaker.levers.{state}"
        if state not in LEVER_STATES:
            raise _invalid(path, f"is not a breaker state with levers ({', '.join(LEVER_STATES)})")
        if not isinstance(lever, dict) or not set(lever) <= set(LEVER_DEFAULTS):
            raise _invalid(path, "must be {max_output_tokens?, fallbacks?}")
        lever = {**copy.deepcopy(LEVER_DEFAULTS), **lever}
        ceiling = lever["max_output_tokens"]
        if ceiling is not None and (type(ceiling) is not int or not 1 <= ceiling <= 10_000_000):
            raise _invalid(f"{path}.max_output_tokens", "must be a positive integer or null")
        fallbacks = lever["fallbacks"]
        if (
            not isinstance(fallbacks, list)
            or len(fallbacks) > MAX_FALLBACKS
            or not all(isinstance(f, str) and f.strip() and len(f) <= FALLBACK_NAME_MAX for f in fallbacks)
            or len(set(fallbacks)) != len(fallbacks)
        ):
            raise _invalid(
                f"{path}.fallbacks",
                f"must be a list of at most {MAX_FALLBACKS} distinct names (1 to {FALLBACK_NAME_MAX} characters)",
            )
        completed[state] = lever
    return completed


def levers_of(policy: PolicyDocument, state: str) -> dict[str, Any] | None:
    """What the policy hands a worker on dispatch while the breaker is ``state``: {max_output_tokens,
    fallbacks}, or None (not THROTTLED / DEGRADED, or no levers set for it)."""
    lever = (policy.get("breaker") or {}).get("levers", {}).get(state)
    return {**LEVER_DEFAULTS, **lever} if lever is not None else None


def _validate_retry_budget(merged: PolicyDocument) -> None:
    budget = merged["retry_budget"]
    if not isinstance(budget, dict) or not set(budget) <= set(STARTER_POLICY["retry_budget"]):
        raise _invalid("policy.retry_budget", f"may have only {', '.join(STARTER_POLICY['retry_budget'])}")
    merged["retry_budget"] = budget = {**STARTER_POLICY["retry_budget"], **budget}
    if type(budget["automatic_attempts"]) is not int or budget["automatic_attempts"] < 1:
        raise _invalid("policy.retry_budget.automatic_attempts", "must be a positive integer")
    if budget["max_attempts"] is not None and (type(budget["max_attempts"]) is not int or budget["max_attempts"] < 1):
        raise _invalid("policy.retry_budget.max_attempts", "must be a positive integer or null")
    cost = budget["max_cost_cents"]
    if cost is not None and (type(cost) is not int or cost < 0):
        raise _invalid("policy.retry_budget.max_cost_cents", "must be cents (an integer >= 0) or null")


def retry_budget_of(policy: PolicyDocument) -> dict[str, Any]:
    """The policy's retry budget, completed with the starter's (a policy stored before it
    existed: 3 automatic attempts, no cap on attempts or cost)."""
    return {**STARTER_POLICY["retry_budget"], **policy.get("retry_budget", {})}


def _name(value: object) -> bool:
    """A tool or action name: a non-empty string without shell wildcards."""
    return isinstance(value, str) and bool(value.strip()) and not any(c in value for c in "*?[]")


def _validate_contracts(contracts: object, reconcilers: Collection[str] | None) -> list[ToolContract]:
    if not isinstance(contracts, list):
        raise _invalid("policy.tool_contracts", "must be a list of contracts")
    completed: list[ToolContract] = []
    seen: set[tuple[str, str]] = set()
    for index, contract in enumerate(contracts):
        path = f"policy.tool_contracts.{index}"
        checked = validate_contract(contract, path=path, reconcilers=reconcilers)
        pair = (checked["tool"], checked["action"])
        if pair in seen:
            raise _invalid(path, f"repeats {pair[0]}.{pair[1]}")
        seen.add(pair)
        completed.append(checked)
    return completed


def validate_contract(
    contract: object, *, path: str = "contract", reconcilers: Collection[str] | None = None
) -> ToolContract:
    """One tool contract completed with the defaults of its optional keys, or InvalidInput
    naming ``path`` and the key at fault (``contract.effect_class``)."""
    if not isinstance(contract, dict):
        raise _invalid(path, "must be an object {tool, action, effect_class, ...}")
    unknown = sorted(set(contract) - set(CONTRACT_KEYS))
    if unknown:
        raise _invalid(f"{path}.{unknown[0]}", f"is not a contract field (a contract has {', '.join(CONTRACT_KEYS)})")
    contract = {**CONTRACT_DEFAULTS, **contract}
    if "tool" not in contract or not _name(contract["tool"]):
        raise _invalid(f"{path}.tool", "must be a tool name (no wildcards)")
    if contract["action"] != "*" and not _name(contract["action"]):
        raise _invalid(f"{path}.action", 'must be an action name, or "*" for every action of the tool')
    if contract.get("effect_class") not in EffectClass.values:
        raise _invalid(f"{path}.effect_class", f"must be one of {', '.join(EffectClass.values)}")
    for key in ("provider", "reconciler"):
        value = contract[key]
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise _invalid(f"{path}.{key}", "must be a name or null")
    if reconcilers is not None and contract["reconciler"] is not None and contract["reconciler"] not in reconcilers:
        raise _invalid(f"{path}.reconciler", f": no reconciler named {contract['reconciler']!r} is configured")
    cost = contract["worst_case_cost_cents"]
    if cost is not None and (type(cost) is not int or cost < 0):
        raise _invalid(f"{path}.worst_case_cost_cents", "must be cents (an integer >= 0) or null")
    if not isinstance(contract["human_approval"], bool):
        raise _invalid(f"{path}.human_approval", "must be true or false")
    return {key: contract[key] for key in CONTRACT_KEYS}


def _validate_window(merged: PolicyDocument, name: str, count: str) -> None:
    window = merged[name]
    if (
        not isinstance(window, dict)
        or set(window) != {count, "window_s"}
        or any(type(v) is not int or v < 1 for v in window.values())
    ):
        raise _invalid(f"policy.{name}", f"must be {{{count}, window_s}}: positive integers")


def _validate_case_timers(timers: object) -> None:
    if (
        not isinstance(timers, dict)
        or set(timers) != {"ack_s", "escalate_s"}
        or any(type(v) is not int or v < 1 for v in timers.values())
    ):
        raise _invalid("policy.case_timers", "must be {ack_s, escalate_s}: positive integers (seconds)")


def case_timers_of(policy: PolicyDocument) -> dict[str, int]:
    """The reconciliation queue's timers under ``policy`` (a policy stored before they
    existed has the starter's: a claim expires after 30 min, an unclaimed case escalates
    after 2 h)."""
    timers: dict[str, int] = {**STARTER_POLICY["case_timers"], **policy.get("case_timers", {})}
    return timers


RUNTIME_AUDIT_RULES = {
    "allow_root": False,
    "allowed_capabilities": [],
    "allow_host_control": False,
    "allow_sensitive_mounts": False,
}


# The rules added after the first four: each optional, and one left out is not enforced (a
# policy written before they existed keeps its meaning). ``output_paths``: the declared output
# directories, the only places a writable mount may be (null: writable mounts not judged).
RUNTIME_AUDIT_OPTIONAL: dict[str, Any] = {
    "allow_writable_root": True,
    "allow_new_privileges": True,
    "output_paths": None,
}


def _validate_runtime_audit(rules: object) -> None:
    if rules is None:
        return
    keys = set(rules) if isinstance(rules, dict) else set()
    if not isinstance(rules, dict) or not set(RUNTIME_AUDIT_RULES) <= keys <= {
        *RUNTIME_AUDIT_RULES,
        *RUNTIME_AUDIT_OPTIONAL,
    }:
        raise _invalid(
            "policy.runtime_audit",
            f"must be null or {{{', '.join(RUNTIME_AUDIT_RULES)}}} with optional {', '.join(RUNTIME_AUDIT_OPTIONAL)}",
        )
    for flag in (
        "allow_root",
        "allow_host_control",
        "allow_sensitive_mounts",
        "allow_writable_root",
        "allow_new_privileges",
    ):
        if flag in rules and not isinstance(rules[flag], bool):
            raise _invalid(f"policy.runtime_audit.{flag}", "must be true or false")
    allowed = rules["allowed_capabilities"]
    if not isinstance(allowed, list) or not all(isinstance(v, str) and v for v in allowed):
        raise _invalid("policy.runtime_audit.allowed_capabilities", "must be a list of capability names")
    paths = rules.get("output_paths")
    if paths is not None and (
        not isinstance(paths, list) or not all(isinstance(v, str) and v.startswith("/") for v in paths)
    ):
        raise _invalid("policy.runtime_audit.output_paths", "must be null or a list of absolute paths")


def _validate_admission(admission: object) -> None:
    if not isinstance(admission, dict) or set(admission) != set(STARTER_POLICY["admission"]):
        raise _invalid("policy.admission", "must be {boot_report_required}")
    if not isinstance(admission["boot_report_required"], bool):
        raise _invalid("policy.admission.boot_report_required", "must be true or false")


# The kinds of flow key and how long a key's name may be (a tool's, a provider's or a flow_key).
FLOW_KEY_KINDS = ("tenant", "tool", "provider", "key")
FLOW_KEY_NAME_MAX = 100


def flow_key_kind(key: object) -> str | None:
    """The kind of a policy's flow key (``tenant``, ``tool``, ``provider``, ``key``), or
    None when it is not one."""
    if key == "tenant":
        return "tenant"
    if not isinstance(key, str) or ":" not in key:
        return None
    kind, name = key.split(":", 1)
    if kind in FLOW_KEY_KINDS[1:] and 0 < len(name) <= FLOW_KEY_NAME_MAX and name.isprintable():
        return kind
    return None


def _flow_keys(limits: object, name: str) -> dict[str, Any]:
    if not isinstance(limits, dict):
        raise _invalid(f"policy.{name}", "must map flow keys to limits")
    for key in limits:
        if flow_key_kind(key) is None:
            raise _invalid(
                f"policy.{name}.{key}",
                "is not a flow key (tenant, tool:<name>, provider:<name>, key:<flow_key> or key:*)",
            )
    return limits


def _validate_flow(concurrency: object, rate_limits: object) -> None:
    for key, places in _flow_keys(concurrency, "concurrency").items():
        if type(places) is not int or places < 1:
            raise _invalid(f"policy.concurrency.{key}", "must be an integer >= 1")
    for key, limit in _flow_keys(rate_limits, "rate_limits").items():
        if not isinstance(limit, dict) or set(limit) != {"per_s", "burst"}:
            raise _invalid(f"policy.rate_limits.{key}", "must have per_s and burst")
        per_s = limit["per_s"]
        if type(per_s) not in (int, float) or not 0 < per_s <= 1_000_000:
            raise _invalid(f"policy.rate_limits.{key}.per_s", "must be a number > 0 (tokens per second)")
        if type(limit["burst"]) is not int or not 1 <= limit["burst"] <= 1_000_000:
            raise _invalid(f"policy.rate_limits.{key}.burst", "must be an integer >= 1")


def flow_limits_of(policy: PolicyDocument) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
    """The policy's (concurrency, rate_limits) (a policy stored before they existed has none)."""
    return policy.get("concurrency", {}), policy.get("rate_limits", {})


def boot_report_required(policy: PolicyDocument) -> bool:
    """Whether a worker must have reported a boot to take a lease (a policy stored before
    the key existed: the starter's, not required)."""
    admission = policy.get("admission") or STARTER_POLICY["admission"]
    return bool(admission["boot_report_required"])


def _limits(value: object, path: str) -> None:
    if not isinstance(value, dict) or any(
        not isinstance(k, str) or type(v) is not int or v < 0 for k, v in value.items()
    ):
        raise _invalid(path, "must map names to limits (integers >= 0)")


def _validate_quotas(merged: PolicyDocument) -> None:
    quotas = merged["quotas"]
    if not isinstance(quotas, dict) or not set(quotas) <= set(STARTER_POLICY["quotas"]):
        raise _invalid("policy.quotas", f"may have only {', '.join(STARTER_POLICY['quotas'])}")
    merged["quotas"] = quotas = {**STARTER_POLICY["quotas"], **quotas}
    for name in ("instances_per_tenant", "instances_per_worker"):
        value = quotas[name]
        if value is not None and (type(value) is not int or value < 0):
            raise _invalid(f"policy.quotas.{name}", "must be an integer >= 0 or null")
    _limits(quotas["instances_per_tool"], "policy.quotas.instances_per_tool")
    _limits(quotas["resources_per_run"], "policy.quotas.resources_per_run")
    if type(quotas["resource_max_age_s"]) is not int or quotas["resource_max_age_s"] < 1:
        raise _invalid("policy.quotas.resource_max_age_s", "must be a positive integer")


def quotas_of(policy: PolicyDocument) -> dict[str, Any]:
    """The policy's quotas, completed with the starter's (a policy stored before quotas existed has none)."""
    return {**STARTER_POLICY["quotas"], **policy.get("quotas", {})}


def resource_limit(policy: PolicyDocument, kind: str) -> int | None:
    """The most open resources of ``kind`` one run may hold under ``policy`` (None: no limit)."""
    limits: dict[str, int] = quotas_of(policy)["resources_per_run"]
    return limits.get(kind, limits.get("*"))


def contracts_of(policy: PolicyDocument) -> list[ToolContract]:
    """The policy's tool contracts, each completed with the optional keys' defaults (a
    policy stored before contracts existed has none)."""
    return [{**CONTRACT_DEFAULTS, **contract} for contract in policy.get("tool_contracts", [])]


def completed_policy(document: PolicyDocument) -> PolicyDocument:
    """A stored document read with today's keys: every key it lacks is the starter's."""
    return {
        **starter_policy(),
        **copy.deepcopy(document),
        "quotas": quotas_of(document),
        "retry_budget": retry_budget_of(document),
        "tool_contracts": contracts_of(document),
    }


def unknown_tool_class_of(policy: PolicyDocument) -> str:
    """What a tool without a contract is taken as (a policy stored before contracts existed:
    the starter's, the worker's declared class)."""
    taken_as: str = policy.get("unknown_tool_class", WORKER_DECLARED)  # the starter's
    return taken_as


def contract_for(policy: PolicyDocument, tool: str, action: str) -> ToolContract | None:
    """The contract for ``tool`` doing ``action``: the exact (tool, action) one first, then
    the tool's "*" contract; None when the tool has neither (``unknown_tool_class_of``
    says what happens then)."""
    contracts = contracts_of(policy)
    exact = next((c for c in contracts if c["tool"] == tool and c["action"] == action), None)
    return exact or next((c for c in contracts if c["tool"] == tool and c["action"] == "*"), None)


def policy_digest(document: PolicyDocument) -> str:
    """ "sha256:" + hex SHA-256 of the document's canonical JSON (sorted keys, no spaces,
    UTF-8, ensure_ascii false): what a decision records of the policy it was made under."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def rule_for(policy: PolicyDocument, tool: str) -> dict[str, Any] | None:
    return next((rule for rule in policy["rules"] if fnmatchcase(tool, rule["tool"])), None)


def allows(policy: PolicyDocument, *, tool: str, action: str, resource: str) -> str | None:
    """None when the policy lets ``tool`` do ``action`` on ``resource``; else why not."""
    rule = rule_for(policy, tool)
    if rule is None:
        return f"policy has no rule for tool {tool!r}"
    if not any(fnmatchcase(action, pattern) for pattern in rule["actions"]):
        return f"policy does not allow action {action!r} for tool {tool!r}"
    if not any(fnmatchcase(resource, pattern) for pattern in rule["resources"]):
        return f"policy does not allow this resource for tool {tool!r}"
    return None


def needs_human(policy: PolicyDocument, tool: str) -> bool:
    return any(fnmatchcase(tool, pattern) for pattern in policy["human_approval_tools"])


def runtime_audit_failures(rules: dict[str, Any] | None, audit: object) -> list[str]:
    """What a boot's container self-audit (``readiness.runtime.evidence.audit``, written by
    ``fenceline_client.runtime_audit``) shows that the policy's ``runtime_audit`` forbids; empty
    when the policy sets no rules or the audit passes them. A missing audit fails closed."""
    if rules is None:
        return []
    if not isinstance(audit, dict):
        return ["the boot carries no container self-audit (readiness.runtime.evidence.audit)"]
    failures: list[str] = []
    uid = audit.get("uid")
    if not rules["allow_root"] and (type(uid) is not int or uid == 0):
        failures.append("runs as root (uid 0)" if uid == 0 else "reports no user id")
    kept = audit.get("capabilities")
    extra = sorted(set(kept) - set(rules["allowed_capabilities"])) if isinstance(kept, list) else ["(unreported)"]
    if extra:
        failures.append(f"keeps capabilities: {', '.join(map(str, extra))}")
    for name, flag, what in (
        ("host_control", "allow_host_control", "host-control paths reachable"),
        ("sensitive_mounts", "allow_sensitive_mounts", "sensitive or broad mounts"),
    ):
        found = audit.get(name)
        if rules[flag]:
            continue
        if not isinstance(found, list):
            failures.append(f"{what}: (unreported)")
        elif found:
            failures.append(f"{what}: {', '.join(map(str, found))}")
    return failures + _filesystem_failures({**RUNTIME_AUDIT_OPTIONAL, **rules}, audit)


def _outside(mount: object, outputs: list[str]) -> bool:
    """Whether a writable mount point is neither a declared output path nor under one."""
    if not isinstance(mount, str):
        return True
    return not any(mount == p.rstrip("/") or mount.startswith(p.rstrip("/") + "/") for p in outputs)


def _filesystem_failures(rules: dict[str, Any], audit: dict[str, Any]) -> list[str]:
    """The container article's filesystem rules: a read-only root, no-new-privileges, and
    writable mounts only at the declared output paths (each fails closed when unreported)."""
    failures: list[str] = []
    if not rules["allow_writable_root"] and audit.get("read_only_root") is not True:
        unreported = not isinstance(audit.get("read_only_root"), bool)
        failures.append("root filesystem writable" + (": (unreported)" if unreported else ""))
    if not rules["allow_new_privileges"] and audit.get("no_new_privileges") is not True:
        unreported = not isinstance(audit.get("no_new_privileges"), bool)
        failures.append("no-new-privileges not set" + (": (unreported)" if unreported else ""))
    outputs, writable = rules["output_paths"], audit.get("writable_mounts")
    if outputs is None:
        return failures
    if not isinstance(writable, list):
        failures.append("writable mounts outside the output paths: (unreported)")
    elif extra := [str(m) for m in writable if _outside(m, outputs)]:
        failures.append(f"writable mounts outside the output paths: {', '.join(extra)}")
    return failures
