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
      "runtime_audit": null,                # null: not enforced; else what a boot's container
                                            # self-audit must show to be admitted:
                                            # {"allow_root": false, "allowed_capabilities": [],
                                            #  "allow_host_control": false,
                                            #  "allow_sensitive_mounts": false}
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
        "throttled_max_dispatched": 2       # in-flight operations allowed while THROTTLED
      }
    }

Patterns in rules use shell-style wildcards (``repo:acme/*``). Capability and credential
scopes are matched exactly at dispatch; policy rules bound what may be requested.
"""

import copy
from fnmatch import fnmatchcase

from ledger.errors import InvalidInput

STARTER_POLICY: dict = {
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
    "max_runtime_s": 86400,
    "cancel_grace_s": 60,
    "restart_budget": {"max_restarts": 5, "window_s": 600},
    "stale_token_limit": {"max_rejections": 50, "window_s": 60},
    "runtime_audit": None,
    "quotas": {
        "instances_per_tenant": None,
        "instances_per_worker": None,
        "instances_per_tool": {},
        "resources_per_run": {},
        "resource_max_age_s": 86400,
    },
    "breaker": {"throttled_at": 0.6, "degraded_at": 0.85, "open_at": 1.0, "throttled_max_dispatched": 2},
}


def starter_policy() -> dict:
    return copy.deepcopy(STARTER_POLICY)


def _positive_int(document: dict, name: str, *, nullable: bool = False) -> None:
    value = document.get(name)
    if value is None and nullable:
        return
    if type(value) is not int or value < 1:
        raise InvalidInput(f"policy.{name} must be a positive integer{' or null' if nullable else ''}")


def _strings(value: object, path: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise InvalidInput(f"{path} must be a non-empty list of strings")
    return value


def validate_policy(document: object) -> dict:
    """The document completed with the starter defaults, or InvalidInput naming the field."""
    if not isinstance(document, dict):
        raise InvalidInput("policy must be a JSON object")
    unknown = set(document) - set(STARTER_POLICY)
    if unknown:
        raise InvalidInput(f"policy has unknown field(s): {', '.join(sorted(unknown))}")
    merged = {**starter_policy(), **copy.deepcopy(document), "starter": False}
    if not isinstance(merged["rules"], list):
        raise InvalidInput("policy.rules must be a list")
    for index, rule in enumerate(merged["rules"]):
        if (
            not isinstance(rule, dict)
            or set(rule) != {"tool", "actions", "resources"}
            or not isinstance(rule["tool"], str)
        ):
            raise InvalidInput(f"policy.rules.{index} must be {{tool, actions, resources}}")
        _strings(rule["actions"], f"policy.rules.{index}.actions")
        _strings(rule["resources"], f"policy.rules.{index}.resources")
    if not isinstance(merged["human_approval_tools"], list):
        raise InvalidInput("policy.human_approval_tools must be a list of tool names")
    for flag in ("require_credential", "require_capability"):
        if not isinstance(merged[flag], bool):
            raise InvalidInput(f"policy.{flag} must be true or false")
    for name in ("max_ttl_s", "max_calls", "approval_ttl_s", "cost_window_s", "reservation_ttl_s", "cancel_grace_s"):
        _positive_int(merged, name)
    for name in ("max_bytes", "idle_limit_s", "max_runtime_s"):
        _positive_int(merged, name, nullable=True)
    limits = merged["cost_limits_cents"]
    if not isinstance(limits, dict) or set(limits) != {"run", "tenant", "retry", "provider"}:
        raise InvalidInput("policy.cost_limits_cents must have run, tenant, retry and provider")
    for key in ("run", "tenant", "retry"):
        if limits[key] is not None and (type(limits[key]) is not int or limits[key] < 0):
            raise InvalidInput(f"policy.cost_limits_cents.{key} must be cents (an integer >= 0) or null")
    if not isinstance(limits["provider"], dict) or any(
        type(v) is not int or v < 0 for v in limits["provider"].values()
    ):
        raise InvalidInput("policy.cost_limits_cents.provider must map provider names to cents")
    _validate_quotas(merged)
    _validate_window(merged, "restart_budget", "max_restarts")
    _validate_window(merged, "stale_token_limit", "max_rejections")
    _validate_runtime_audit(merged["runtime_audit"])
    breaker = merged["breaker"]
    if not isinstance(breaker, dict) or set(breaker) != set(STARTER_POLICY["breaker"]):
        raise InvalidInput("policy.breaker must have throttled_at, degraded_at, open_at, throttled_max_dispatched")
    shares = [breaker["throttled_at"], breaker["degraded_at"], breaker["open_at"]]
    if (
        not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in shares)
        or not 0 < shares[0] <= shares[1] <= shares[2] <= 1
    ):
        raise InvalidInput("policy.breaker thresholds must satisfy 0 < throttled_at <= degraded_at <= open_at <= 1")
    if type(breaker["throttled_max_dispatched"]) is not int or breaker["throttled_max_dispatched"] < 1:
        raise InvalidInput("policy.breaker.throttled_max_dispatched must be a positive integer")
    return merged


def _validate_window(merged: dict, name: str, count: str) -> None:
    window = merged[name]
    if (
        not isinstance(window, dict)
        or set(window) != {count, "window_s"}
        or any(type(v) is not int or v < 1 for v in window.values())
    ):
        raise InvalidInput(f"policy.{name} must be {{{count}, window_s}}: positive integers")


RUNTIME_AUDIT_RULES = {
    "allow_root": False,
    "allowed_capabilities": [],
    "allow_host_control": False,
    "allow_sensitive_mounts": False,
}


def _validate_runtime_audit(rules: object) -> None:
    if rules is None:
        return
    if not isinstance(rules, dict) or set(rules) != set(RUNTIME_AUDIT_RULES):
        raise InvalidInput(f"policy.runtime_audit must be null or {{{', '.join(RUNTIME_AUDIT_RULES)}}}")
    for flag in ("allow_root", "allow_host_control", "allow_sensitive_mounts"):
        if not isinstance(rules[flag], bool):
            raise InvalidInput(f"policy.runtime_audit.{flag} must be true or false")
    allowed = rules["allowed_capabilities"]
    if not isinstance(allowed, list) or not all(isinstance(v, str) and v for v in allowed):
        raise InvalidInput("policy.runtime_audit.allowed_capabilities must be a list of capability names")


def _limits(value: object, path: str) -> None:
    if not isinstance(value, dict) or any(
        not isinstance(k, str) or type(v) is not int or v < 0 for k, v in value.items()
    ):
        raise InvalidInput(f"{path} must map names to limits (integers >= 0)")


def _validate_quotas(merged: dict) -> None:
    quotas = merged["quotas"]
    if not isinstance(quotas, dict) or not set(quotas) <= set(STARTER_POLICY["quotas"]):
        raise InvalidInput(f"policy.quotas may have only {', '.join(STARTER_POLICY['quotas'])}")
    merged["quotas"] = quotas = {**STARTER_POLICY["quotas"], **quotas}
    for name in ("instances_per_tenant", "instances_per_worker"):
        value = quotas[name]
        if value is not None and (type(value) is not int or value < 0):
            raise InvalidInput(f"policy.quotas.{name} must be an integer >= 0 or null")
    _limits(quotas["instances_per_tool"], "policy.quotas.instances_per_tool")
    _limits(quotas["resources_per_run"], "policy.quotas.resources_per_run")
    if type(quotas["resource_max_age_s"]) is not int or quotas["resource_max_age_s"] < 1:
        raise InvalidInput("policy.quotas.resource_max_age_s must be a positive integer")


def quotas_of(policy: dict) -> dict:
    """The policy's quotas, completed with the starter's (a policy stored before quotas existed has none)."""
    return {**STARTER_POLICY["quotas"], **policy.get("quotas", {})}


def resource_limit(policy: dict, kind: str) -> int | None:
    """The most open resources of ``kind`` one run may hold under ``policy`` (None: no limit)."""
    limits = quotas_of(policy)["resources_per_run"]
    return limits.get(kind, limits.get("*"))


def rule_for(policy: dict, tool: str) -> dict | None:
    return next((rule for rule in policy["rules"] if fnmatchcase(tool, rule["tool"])), None)


def allows(policy: dict, *, tool: str, action: str, resource: str) -> str | None:
    """None when the policy lets ``tool`` do ``action`` on ``resource``; else why not."""
    rule = rule_for(policy, tool)
    if rule is None:
        return f"policy has no rule for tool {tool!r}"
    if not any(fnmatchcase(action, pattern) for pattern in rule["actions"]):
        return f"policy does not allow action {action!r} for tool {tool!r}"
    if not any(fnmatchcase(resource, pattern) for pattern in rule["resources"]):
        return f"policy does not allow this resource for tool {tool!r}"
    return None


def needs_human(policy: dict, tool: str) -> bool:
    return any(fnmatchcase(tool, pattern) for pattern in policy["human_approval_tools"])


def runtime_audit_failures(rules: dict | None, audit: object) -> list[str]:
    """What a boot's container self-audit (``readiness.runtime.evidence.audit``, written by
    ``ledger.client.runtime_audit``) shows that the policy's ``runtime_audit`` forbids; empty
    when the policy sets no rules or the audit passes them. A missing audit fails closed."""
    if rules is None:
        return []
    if not isinstance(audit, dict):
        return ["the boot carries no container self-audit (readiness.runtime.evidence.audit)"]
    failures = []
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
    return failures
