"""Tool contracts in the policy: their shape (every refusal names the exact path), their
defaults, what a policy stored before contracts existed reads as, the lookup (exact action
first, then the tool's "*"), and the digest decisions record."""

import hashlib
import json

import pytest

from ledger.errors import InvalidInput
from ledger.policy import (
    STARTER_POLICY,
    contract_for,
    contracts_of,
    policy_digest,
    starter_policy,
    unknown_tool_class_of,
    validate_policy,
)

CHARGE = {
    "tool": "payments",
    "action": "charge",
    "effect_class": "NON_RETRYABLE",
    "provider": "sandbox-payments",
    "reconciler": "sandbox-payments",
    "worst_case_cost_cents": 5000,
    "human_approval": False,
}


def refusal(document, **kwargs) -> InvalidInput:
    with pytest.raises(InvalidInput) as refused:
        validate_policy(document, **kwargs)
    return refused.value


def test_the_starter_has_no_contracts_and_takes_the_workers_declared_class():
    assert STARTER_POLICY["tool_contracts"] == []
    assert STARTER_POLICY["unknown_tool_class"] == "WORKER_DECLARED"
    assert validate_policy({})["tool_contracts"] == []


def test_a_policy_stored_before_contracts_existed_reads_as_the_starters():
    old = starter_policy()
    del old["tool_contracts"], old["unknown_tool_class"]
    assert contracts_of(old) == []
    assert unknown_tool_class_of(old) == "WORKER_DECLARED"
    assert contract_for(old, "payments", "charge") is None


def test_a_contracts_missing_optional_keys_take_their_defaults():
    merged = validate_policy({"tool_contracts": [{"tool": "search", "effect_class": "PURE"}]})
    assert merged["tool_contracts"] == [
        {
            "tool": "search",
            "action": "*",
            "effect_class": "PURE",
            "provider": None,
            "reconciler": None,
            "worst_case_cost_cents": None,
            "human_approval": False,
        }
    ]


def test_a_bad_effect_class_is_refused_naming_its_path_and_the_choices():
    contracts = [{"tool": f"t{i}", "effect_class": "PURE"} for i in range(2)] + [{**CHARGE, "effect_class": "MAYBE"}]
    error = refusal({"tool_contracts": contracts})
    assert str(error) == (
        "policy.tool_contracts.2.effect_class must be one of PURE, IDEMPOTENT, REPLAYABLE, UNKNOWN, NON_RETRYABLE"
    )
    assert error.extra["fields"][0]["field"] == "policy.tool_contracts.2.effect_class"


def test_a_repeated_tool_and_action_is_refused_naming_the_second():
    contracts = [CHARGE, {"tool": "payments", "effect_class": "UNKNOWN"}, {"tool": "x", "effect_class": "PURE"}, CHARGE]
    error = refusal({"tool_contracts": contracts})
    assert str(error) == "policy.tool_contracts.3 repeats payments.charge"
    assert error.extra["fields"][0]["field"] == "policy.tool_contracts.3"


@pytest.mark.parametrize(
    ("contract", "path"),
    [
        ({**CHARGE, "colour": "red"}, "policy.tool_contracts.0.colour"),
        ({"effect_class": "PURE"}, "policy.tool_contracts.0.tool"),
        ({**CHARGE, "tool": "pay*"}, "policy.tool_contracts.0.tool"),
        ({**CHARGE, "action": ""}, "policy.tool_contracts.0.action"),
        ({**CHARGE, "provider": 7}, "policy.tool_contracts.0.provider"),
        ({**CHARGE, "reconciler": ""}, "policy.tool_contracts.0.reconciler"),
        ({**CHARGE, "worst_case_cost_cents": -1}, "policy.tool_contracts.0.worst_case_cost_cents"),
        ({**CHARGE, "worst_case_cost_cents": True}, "policy.tool_contracts.0.worst_case_cost_cents"),
        ({**CHARGE, "human_approval": "yes"}, "policy.tool_contracts.0.human_approval"),
        ("payments", "policy.tool_contracts.0"),
    ],
)
def test_a_malformed_contract_is_refused_naming_the_exact_path(contract, path):
    error = refusal({"tool_contracts": [contract]})
    assert str(error).startswith(path)
    assert error.extra["fields"][0]["field"] == path


def test_unknown_tool_class_is_one_of_the_choices():
    for value in ("WORKER_DECLARED", "REFUSE", "UNKNOWN", "NON_RETRYABLE"):
        assert validate_policy({"unknown_tool_class": value})["unknown_tool_class"] == value
    error = refusal({"unknown_tool_class": "ASK"})
    assert str(error).startswith("policy.unknown_tool_class must be one of WORKER_DECLARED, REFUSE, PURE")


def test_a_reconciler_must_be_configured_when_the_names_are_given():
    assert validate_policy({"tool_contracts": [CHARGE]})  # names not given: not checked
    assert validate_policy({"tool_contracts": [CHARGE]}, reconcilers={"sandbox-payments": {}}.keys())
    error = refusal({"tool_contracts": [{**CHARGE, "reconciler": "x"}]}, reconcilers=["sandbox-payments"])
    assert str(error) == "policy.tool_contracts.0.reconciler: no reconciler named 'x' is configured"


def test_every_policy_refusal_carries_its_path_as_the_field():
    for document, path in (
        ({"max_ttl_s": 0}, "policy.max_ttl_s"),
        ({"nonsense": 1}, "policy.nonsense"),
        ({"quotas": {"instances_per_tenant": -1}}, "policy.quotas.instances_per_tenant"),
        ({"rules": [{"tool": "*"}]}, "policy.rules.0"),
        ({"tool_contracts": {}}, "policy.tool_contracts"),
    ):
        error = refusal(document)
        assert error.extra["fields"][0]["field"] == path
        assert str(error).startswith(path)


def test_the_exact_action_contract_wins_over_the_tools_star_contract():
    policy = validate_policy(
        {
            "tool_contracts": [
                {"tool": "payments", "effect_class": "UNKNOWN"},
                CHARGE,
                {"tool": "search", "effect_class": "PURE"},
            ]
        }
    )
    assert contract_for(policy, "payments", "charge")["effect_class"] == "NON_RETRYABLE"
    assert contract_for(policy, "payments", "refund")["effect_class"] == "UNKNOWN"
    assert contract_for(policy, "search", "query")["effect_class"] == "PURE"
    assert contract_for(policy, "mail", "send") is None
    assert contract_for(policy, "Payments", "charge") is None  # tool names are exact


def test_the_digest_is_sha256_of_the_canonical_json():
    document = {"b": [1, "é"], "a": None}
    expected = hashlib.sha256('{"a":null,"b":[1,"é"]}'.encode()).hexdigest()
    assert policy_digest(document) == f"sha256:{expected}"
    assert policy_digest(json.loads(json.dumps(document, indent=4))) == policy_digest(document)
    assert policy_digest({**document, "a": 0}) != policy_digest(document)
