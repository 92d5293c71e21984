"""The retry budget over HTTP (issue 39, item 5): the retry-decision answers STOP naming the
budget once it is spent, the retry is 403 DENY_BUDGET naming it, and the chain records the
refusal; a bad budget in a policy change is 422 naming the field and writes nothing."""

import pytest
from django.urls import reverse

from ledger.models import Event, TenantPolicy
from tests.factories import set_policy
from tests.helpers import Browser

pytestmark = pytest.mark.django_db(transaction=True)


def failed(client, run_id, key):
    op = client.intend(run_id, 1, key, effect_class="IDEMPOTENT")
    op_id = op.body["operation_id"]
    assert client.authorize(op_id, 1).status == 200
    assert client.dispatch(op_id, 1).status == 200
    assert client.outcome(op_id, 1, "FAILED", error_code="TIMEOUT").status == 200
    return op_id


def test_a_retry_past_the_attempts_budget_is_403_naming_it_and_in_the_chain(api_for, acme):
    set_policy(acme.tenant, retry_budget={"max_attempts": 1})
    client = api_for(acme)
    run_id = client.leased_run()
    op_id = failed(client, run_id, "k")

    decision = client.get(f"/operations/{op_id}/retry-decision")
    refused = client.post(f"/operations/{op_id}/retry", {"fencing_token": 1})

    assert decision.status == 200 and decision.body["decision"] == "STOP"
    assert "retry_budget:attempts" in decision.body["reason"]
    assert refused.status == 403, refused
    assert (refused.body["error"], refused.body["decision"], refused.body["budget"]) == (
        "DENY_BUDGET",
        "DENY_BUDGET",
        "retry_budget:attempts",
    )
    event = Event.objects.get(run_id=run_id, type="RETRY_REFUSED")
    assert event.fields["budget"] == "retry_budget:attempts"


def test_within_the_budget_the_retry_starts_the_next_attempt(api_for, acme):
    set_policy(acme.tenant, retry_budget={"max_attempts": 2, "max_cost_cents": 1000})
    client = api_for(acme)
    run_id = client.leased_run()
    op_id = failed(client, run_id, "k")
    assert client.get(f"/operations/{op_id}/retry-decision").body["decision"] == "RETRY_SAME_KEY"
    answer = client.post(f"/operations/{op_id}/retry", {"fencing_token": 1})
    assert answer.status == 200 and answer.body["attempt"] == 2


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ('{"retry_budget": {"max_attempts": 0}}', "policy.retry_budget.max_attempts"),
        (
            '{"breaker": {"throttled_at": 0.6, "degraded_at": 0.85, "open_at": 1.0, "throttled_max_dispatched": 2,'
            ' "levers": {"THROTTLED": {"max_output_tokens": -5}}}}',
            "policy.breaker.levers.THROTTLED.max_output_tokens",
        ),
    ],
)
def test_a_bad_budget_or_lever_in_a_policy_change_is_422_naming_the_field(acme, admin, document, field):
    page = Browser(admin).post(reverse("tenant-policy", args=["acme"]), {"document": document, "reason": "levers"})
    assert page.status_code == 422
    assert field in page.content.decode()
    assert TenantPolicy.objects.filter(tenant=acme.tenant).count() == 1
