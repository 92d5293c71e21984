"""The breaker's levers over HTTP (issue 39, item 5): while the tenant's cost breaker is
THROTTLED or DEGRADED, dispatch and the one-call effect answer the policy's output ceiling and
fallbacks; every dispatch answers the cost reservation it made; the outcome's fallback_used is
kept; the Python client exposes all three."""

import pytest

from fenceline_client import Client, Done, Levers
from ledger.models import CostReservation, Event, Operation
from tests.factories import set_policy

pytestmark = pytest.mark.django_db(transaction=True)

LEVERS = {
    "THROTTLED": {"max_output_tokens": 512, "fallbacks": ["small-model", "tiny-model"]},
    "DEGRADED": {"max_output_tokens": 128},
}


def levered_policy(tenant, limit=1000):
    set_policy(
        tenant,
        cost_limits_cents={"run": None, "tenant": limit, "retry": None, "provider": {}},
        breaker={
            "throttled_at": 0.6,
            "degraded_at": 0.85,
            "open_at": 1.0,
            "throttled_max_dispatched": 5,
            "levers": LEVERS,
        },
    )


def model_call(client, run_id, key, estimate, effect_class="PURE"):
    op = client.intend(
        run_id, 1, key, tool="llm", action="complete", resource="model:summarize", effect_class=effect_class,
        provider="openai", estimated_cost_cents=estimate,
    )  # fmt: skip
    assert op.status == 201, op
    assert client.authorize(op.body["operation_id"], 1).status == 200
    return op.body["operation_id"]


def test_dispatch_answers_its_reservation_and_the_levers_of_the_state_it_left_the_breaker_in(api_for, acme):
    levered_policy(acme.tenant)
    client = api_for(acme)
    run_id = client.leased_run()

    calm = client.dispatch(model_call(client, run_id, "k0", 100), 1)  # 10%: NORMAL
    throttled = client.dispatch(model_call(client, run_id, "k1", 500), 1)  # 60%: THROTTLED
    degraded = client.dispatch(model_call(client, run_id, "k2", 250), 1)  # 85%: DEGRADED

    assert calm.status == 200 and calm.body["levers"] is None
    assert throttled.body["levers"] == {
        "state": "THROTTLED",
        "max_output_tokens": 512,
        "fallbacks": ["small-model", "tiny-model"],
    }
    assert degraded.body["levers"] == {"state": "DEGRADED", "max_output_tokens": 128, "fallbacks": []}
    for answer, key in ((calm, "k0"), (throttled, "k1"), (degraded, "k2")):
        reservation = CostReservation.objects.get(operation__idempotency_key=key)
        assert answer.body["reservation_id"] == str(reservation.pk)
        assert Event.objects.filter(type="COST_RESERVED", fields__reservation_id=str(reservation.pk)).count() == 1


def test_a_dispatch_that_reserves_nothing_answers_no_reservation(api_for, acme):
    client = api_for(acme)
    run_id = client.leased_run()
    op = client.intend(run_id, 1, "mail")
    client.authorize(op.body["operation_id"], 1)
    answer = client.dispatch(op.body["operation_id"], 1)
    assert answer.body == {"phase": "DISPATCHED", "reservation_id": None, "levers": None}


def test_the_effect_call_answers_the_levers_and_the_outcome_keeps_fallback_used(api_for, acme):
    levered_policy(acme.tenant)
    client = api_for(acme)
    run_id = client.leased_run()
    base = {
        "fencing_token": 1,
        "tool": "llm",
        "action": "complete",
        "resource": "model:x",
        "effect_class": "PURE",
        "provider": "openai",
    }
    first = client.post(f"/runs/{run_id}/effects", {**base, "idempotency_key": "e1", "estimated_cost_cents": 700})
    assert first.status == 201, first
    assert first.body["levers"]["state"] == "THROTTLED"
    assert first.body["reservation_id"] == str(CostReservation.objects.get(operation_id=first.body["operation_id"]).pk)

    reported = client.outcome(first.body["operation_id"], 1, "CONFIRMED", actual_cost_cents=90, fallback_used=True)

    assert reported.status == 200, reported
    assert Operation.objects.get(pk=first.body["operation_id"]).fallback_used is True
    confirmed = Event.objects.get(type="OPERATION_CONFIRMED", fields__operation_id=first.body["operation_id"])
    assert confirmed.fields["fallback_used"] is True


def test_a_fallback_used_that_is_not_a_boolean_is_refused_naming_the_field(api_for, acme):
    client = api_for(acme)
    run_id = client.leased_run()
    op = client.intend(run_id, 1, "mail")
    client.authorize(op.body["operation_id"], 1)
    client.dispatch(op.body["operation_id"], 1)
    refused = client.outcome(op.body["operation_id"], 1, "CONFIRMED", fallback_used="yes")
    assert refused.status == 422 and "fallback_used" in str(refused.body)
    assert Operation.objects.get(pk=op.body["operation_id"]).phase == "DISPATCHED"


def test_the_python_client_exposes_levers_and_reservation_and_reports_fallback_used(live_server, acme):
    levered_policy(acme.tenant)
    client = Client(live_server.url, token=acme.token, timeout=10)
    call = {"tool": "llm", "action": "complete", "resource": "model:x", "effect_class": "PURE", "provider": "openai"}
    with client.lease(client.create_run(), ttl_s=30) as lease:
        started = lease.effect_start(idempotency_key="c1", estimated_cost_cents=650, **call)
        assert started.levers == Levers("THROTTLED", 512, ("small-model", "tiny-model"))
        assert started.reservation_id == str(CostReservation.objects.get(operation_id=started.operation_id).pk)
        lease.effect_outcome(
            started.operation_id, Done(actual_cost_cents=650, fallback_used=True)
        )  # still 65%: THROTTLED

        seen = []

        def perform() -> Done:
            seen.append(lease.levers)
            return Done(actual_cost_cents=5, fallback_used=False)

        lease.operation(idempotency_key="c2", perform=perform, estimated_cost_cents=10, **call)
    assert seen == [Levers("THROTTLED", 512, ("small-model", "tiny-model"))]
    assert dict(Operation.objects.values_list("idempotency_key", "fallback_used")) == {"c1": True, "c2": False}
