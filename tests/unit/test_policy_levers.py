"""The breaker's levers and the retry budget in the policy document (issue 39, item 5):
``breaker.levers`` and ``retry_budget`` are completed with their defaults, and a bad value is
refused naming its field."""

import pytest

from ledger.errors import InvalidInput
from ledger.policy import STARTER_POLICY, completed_policy, levers_of, retry_budget_of, validate_policy

BREAKER = {"throttled_at": 0.6, "degraded_at": 0.85, "open_at": 1.0, "throttled_max_dispatched": 2}


def test_levers_are_completed_with_their_defaults_and_read_per_state():
    policy = validate_policy(
        {
            "breaker": {
                **BREAKER,
                "levers": {"THROTTLED": {"fallbacks": ["small"]}, "DEGRADED": {"max_output_tokens": 64}},
            }
        }
    )
    assert policy["breaker"]["levers"] == {
        "THROTTLED": {"max_output_tokens": None, "fallbacks": ["small"]},
        "DEGRADED": {"max_output_tokens": 64, "fallbacks": []},
    }
    assert levers_of(policy, "THROTTLED") == {"max_output_tokens": None, "fallbacks": ["small"]}
    assert levers_of(policy, "NORMAL") is None
    assert levers_of(STARTER_POLICY, "THROTTLED") is None  # the starter hands none


def test_a_breaker_without_levers_is_still_valid():
    assert "levers" not in validate_policy({"breaker": BREAKER})["breaker"]


@pytest.mark.parametrize(
    ("levers", "field"),
    [
        ([], "policy.breaker.levers"),
        ({"OPEN": {}}, "policy.breaker.levers.OPEN"),
        ({"THROTTLED": {"model": "x"}}, "policy.breaker.levers.THROTTLED"),
        ({"THROTTLED": {"max_output_tokens": 0}}, "policy.breaker.levers.THROTTLED.max_output_tokens"),
        ({"DEGRADED": {"max_output_tokens": "100"}}, "policy.breaker.levers.DEGRADED.max_output_tokens"),
        ({"DEGRADED": {"fallbacks": "small"}}, "policy.breaker.levers.DEGRADED.fallbacks"),
        ({"DEGRADED": {"fallbacks": ["a", "a"]}}, "policy.breaker.levers.DEGRADED.fallbacks"),
        ({"DEGRADED": {"fallbacks": [""]}}, "policy.breaker.levers.DEGRADED.fallbacks"),
        ({"DEGRADED": {"fallbacks": [f"m{i}" for i in range(17)]}}, "policy.breaker.levers.DEGRADED.fallbacks"),
    ],
)
def test_a_bad_lever_is_refused_naming_its_field(levers, field):
    with pytest.raises(InvalidInput) as refused:
        validate_policy({"breaker": {**BREAKER, "levers": levers}})
    assert refused.value.extra["fields"][0]["field"] == field


def test_the_retry_budget_defaults_to_three_automatic_attempts_and_no_caps():
    assert validate_policy({})["retry_budget"] == {
        "automatic_attempts": 3,
        "max_attempts": None,
        "max_cost_cents": None,
    }
    assert validate_policy({"retry_budget": {"max_cost_cents": 500}})["retry_budget"]["automatic_attempts"] == 3
    # A policy stored before the key existed reads as the starter's.
    stored = {k: v for k, v in STARTER_POLICY.items() if k != "retry_budget"}
    assert retry_budget_of(stored)["automatic_attempts"] == 3
    assert completed_policy(stored)["retry_budget"]["max_attempts"] is None


@pytest.mark.parametrize(
    ("budget", "field"),
    [
        ({"attempts": 3}, "policy.retry_budget"),
        ({"automatic_attempts": 0}, "policy.retry_budget.automatic_attempts"),
        ({"max_attempts": 0}, "policy.retry_budget.max_attempts"),
        ({"max_attempts": True}, "policy.retry_budget.max_attempts"),
        ({"max_cost_cents": -1}, "policy.retry_budget.max_cost_cents"),
        ({"max_cost_cents": 1.5}, "policy.retry_budget.max_cost_cents"),
    ],
)
def test_a_bad_retry_budget_is_refused_naming_its_field(budget, field):
    with pytest.raises(InvalidInput) as refused:
        validate_policy({"retry_budget": budget})
    assert refused.value.extra["fields"][0]["field"] == field
