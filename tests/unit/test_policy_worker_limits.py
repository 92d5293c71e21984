"""The policy's worker limits: the restart budget and the stale-token limit are
{count, window_s} of positive integers; runtime_audit is null or the four rules; and what a
self-audit shows against those rules, a missing audit failing closed."""

import pytest

from ledger.errors import InvalidInput
from ledger.policy import RUNTIME_AUDIT_RULES, runtime_audit_failures, validate_policy


@pytest.mark.parametrize(
    "document",
    [
        {"stale_token_limit": {"max_rejections": 0, "window_s": 60}},
        {"stale_token_limit": {"max_rejections": 5}},
        {"restart_budget": {"max_restarts": True, "window_s": 600}},
        {"runtime_audit": {"allow_root": False}},
        {"runtime_audit": {**RUNTIME_AUDIT_RULES, "allow_root": "no"}},
        {"runtime_audit": {**RUNTIME_AUDIT_RULES, "allowed_capabilities": "chown"}},
    ],
)
def test_a_malformed_worker_limit_is_refused_naming_it(document):
    with pytest.raises(InvalidInput) as refused:
        validate_policy(document)
    assert f"policy.{next(iter(document))}" in str(refused.value)


def test_the_starter_limits_and_a_strict_audit_are_accepted():
    merged = validate_policy({"runtime_audit": RUNTIME_AUDIT_RULES})
    assert merged["stale_token_limit"] == {"max_rejections": 50, "window_s": 60}
    assert merged["runtime_audit"] == RUNTIME_AUDIT_RULES


def test_audit_rules_allow_what_they_name_and_nothing_else():
    rules = {**RUNTIME_AUDIT_RULES, "allowed_capabilities": ["net_bind_service"], "allow_sensitive_mounts": True}
    audit = {"uid": 10001, "capabilities": ["net_bind_service"], "host_control": [], "sensitive_mounts": ["/home"]}
    assert runtime_audit_failures(rules, audit) == []
    assert runtime_audit_failures(None, None) == []  # no rules: not enforced
    assert runtime_audit_failures(rules, None) == [
        "the boot carries no container self-audit (readiness.runtime.evidence.audit)"
    ]
    assert runtime_audit_failures(RUNTIME_AUDIT_RULES, {"uid": "0"}) == [
        "reports no user id",
        "keeps capabilities: (unreported)",
        "host-control paths reachable: (unreported)",
        "sensitive or broad mounts: (unreported)",
    ]
