"""Flow control over HTTP (issue 39, item 4): a dispatch past a flow limit is 409 THROTTLED
with retry_after_s in the body and the Retry-After header, naming the key; the operation
stays AUTHORIZED; flow_key is part of the intent; the Python client raises Throttled."""

import pytest

from fenceline_client import Client, Done, Throttled
from ledger.models import Operation
from tests.factories import set_policy

pytestmark = pytest.mark.django_db(transaction=True)


def authorized(client, run_id, key, **overrides):
    op = client.intend(run_id, 1, key, effect_class="IDEMPOTENT", **overrides)
    assert op.status == 201, op
    assert client.authorize(op.body["operation_id"], 1).status == 200
    return op.body["operation_id"]


def test_a_dispatch_past_a_flow_key_limit_is_409_throttled_with_retry_after(api_for, acme):
    set_policy(acme.tenant, concurrency={"key:*": 1})
    client = api_for(acme)
    run_id = client.leased_run()
    first, second = (
        authorized(client, run_id, "a", flow_key="cust-1"),
        authorized(client, run_id, "b", flow_key="cust-1"),
    )
    assert client.dispatch(first, 1).status == 200

    refused = client.dispatch(second, 1)

    assert refused.status == 409
    assert refused.body["error"] == "THROTTLED"
    assert (refused.body["key"], refused.body["limit"], refused.body["retry_after_s"]) == (
        "key:cust-1",
        "concurrency",
        1,
    )
    assert refused.raw.headers["Retry-After"] == "1"
    assert Operation.objects.get(pk=second).phase == "AUTHORIZED"
    assert client.get(f"/operations/{second}").body["flow_key"] == "cust-1"
    assert client.outcome(first, 1, "CONFIRMED").status == 200
    assert client.dispatch(second, 1).status == 200  # the same dispatch, sent again


@pytest.mark.parametrize("flow_key", ["x" * 101, "has space", 7])
def test_a_bad_flow_key_is_refused_naming_the_field(api_for, acme, flow_key):
    client = api_for(acme)
    run_id = client.leased_run()
    refused = client.intend(run_id, 1, "k", flow_key=flow_key)
    assert refused.status == 422, refused
    assert "flow_key" in str(refused.body)
    assert not Operation.objects.exists()


def test_the_python_client_raises_throttled_naming_the_key(live_server, acme):
    set_policy(acme.tenant, rate_limits={"tool:email": {"per_s": 0.001, "burst": 1}})
    client = Client(live_server.url, token=acme.token, timeout=10)
    run_id = client.post("/runs", {"schema_version": 1})["run_id"]
    token = client.post(f"/runs/{run_id}/lease", {"owner_id": "w", "ttl_s": 30})["fencing_token"]
    ops = []
    for key in ("p-1", "p-2"):
        body = {"fencing_token": token, "tool": "email", "action": "send", "resource": "mailto:a@example.com"}
        op = client.post(f"/runs/{run_id}/operations", {**body, "idempotency_key": key, "effect_class": "IDEMPOTENT"})
        client.post(f"/operations/{op['operation_id']}/authorize", {"fencing_token": token})
        ops.append(op["operation_id"])
    client.post(f"/operations/{ops[0]}/dispatch", {"fencing_token": token})
    with pytest.raises(Throttled) as refused:
        client.post(f"/operations/{ops[1]}/dispatch", {"fencing_token": token})
    assert refused.value.key == "tool:email"
    assert refused.value.retry_after_s > 1


def test_effect_start_names_the_flow_key_and_the_same_call_dispatches_once_there_is_room(live_server, acme):
    set_policy(acme.tenant, concurrency={"key:cust-9": 1})
    client = Client(live_server.url, token=acme.token, timeout=10)
    with client.lease(client.create_run(), ttl_s=30) as lease:
        first = lease.effect_start(
            tool="email", action="send", resource="mailto:a@example.com", idempotency_key="e-1",
            effect_class="IDEMPOTENT", flow_key="cust-9",
        )  # fmt: skip
        assert first.phase == "DISPATCHED"
        second = {
            "tool": "email", "action": "send", "resource": "mailto:b@example.com", "idempotency_key": "e-2",
            "effect_class": "IDEMPOTENT", "flow_key": "cust-9",
        }  # fmt: skip
        with pytest.raises(Throttled) as refused:
            lease.effect_start(**second)
        assert refused.value.key == "key:cust-9"
        lease.effect_outcome(first.operation_id, Done(outcome="CONFIRMED"))
        assert lease.effect_start(**second).phase == "DISPATCHED"  # the same key, dispatched now
