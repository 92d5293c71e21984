"""The Capability Budget article's seven failure modes, one test each, over HTTP, and the
race of sixteen processes for the last calls of a capability."""

import multiprocessing as mp
from datetime import timedelta

from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.models import CapabilityBudget, Operation
from ledger.services.authority.policy import policy_change
from tests.factories import expire

RESOURCE = "repo:acme/api:pull:481"


def grant(client, run_id, token=1, **overrides):
    body = {
        "fencing_token": token,
        "tool": "github",
        "actions": ["comment"],
        "resources": [RESOURCE],
        "max_calls": 1,
        "ttl_s": 600,
    }
    body.update(overrides)
    return client.post(f"/runs/{run_id}/capabilities", body)


def intend(client, run_id, key, token=1, **overrides):
    fields = {"tool": "github", "action": "comment", "resource": RESOURCE, "effect_class": "IDEMPOTENT"}
    fields.update(overrides)
    return client.intend(run_id, token, key, **fields)


def test_worker_pausing_between_authorize_and_dispatch_cannot_overspend(api_for, acme, leased):
    client, run_id = leased
    assert grant(client, run_id).status == 201
    first = intend(client, run_id, "c-1").body["operation_id"]
    second = intend(client, run_id, "c-2").body["operation_id"]
    assert client.authorize(first, 1).status == 200
    assert client.authorize(second, 1).status == 200  # one call left when each was checked
    # The first worker pauses here; the second dispatches and takes the last call.
    assert client.dispatch(second, 1).status == 200
    late = client.dispatch(first, 1)
    assert (late.status, late.body["error"], late.body["budget"]) == (403, "DENY_BUDGET", "capability:calls")
    assert Operation.objects.get(pk=first).phase == "DENIED"
    assert CapabilityBudget.objects.get(run_id=run_id).used_calls == 1


def test_provider_timeout_after_accept_is_unknown_and_needs_a_lookup_before_retry(api_for, acme, leased):
    client, run_id = leased
    grant(client, run_id, max_calls=2)
    op = intend(client, run_id, "c-1").body["operation_id"]
    client.authorize(op, 1)
    client.dispatch(op, 1)
    assert client.outcome(op, 1, "UNKNOWN", error_code="READ_TIMEOUT").body == {"phase": "UNKNOWN"}
    assert ReconciliationCase.objects.filter(operation_id=op, status="OPEN").count() == 1
    assert client.get(f"/operations/{op}/retry-decision").body["decision"] == "RECONCILE"
    retry = client.post(f"/operations/{op}/retry", {"fencing_token": 1})
    assert (retry.status, retry.body["error"]) == (409, "RECONCILE_FIRST")
    assert CapabilityBudget.objects.get(run_id=run_id).used_calls == 1  # the call was spent


def test_policy_change_while_queued_is_enforced_at_dispatch(api_for, acme, leased):
    client, run_id = leased
    grant(client, run_id)
    op = intend(client, run_id, "c-1").body["operation_id"]
    assert client.authorize(op, 1).status == 200
    policy_change(
        tenant=acme.tenant,
        document={"rules": [{"tool": "jira", "actions": ["*"], "resources": ["*"]}]},
        changed_by="admin",
        reason="github writes suspended",
    )
    refused = client.dispatch(op, 1)
    assert (refused.status, refused.body["error"], refused.body["decision"]) == (403, "DENY_POLICY", "DENY_POLICY")
    op_row = Operation.objects.get(pk=op)
    assert (op_row.phase, op_row.decision_code, op_row.decision_policy_version) == ("DENIED", "DENY_POLICY", 2)
    assert CapabilityBudget.objects.get(run_id=run_id).used_calls == 0


def test_a_changed_resource_between_planning_and_dispatch_is_refused(api_for, acme, leased):
    client, run_id = leased
    grant(client, run_id)
    assert intend(client, run_id, "c-1").status == 201
    # The same intent with another resource is not the same operation...
    replay = intend(client, run_id, "c-1", resource="repo:acme/api:pull:482")
    assert (replay.status, replay.body["error"]) == (422, "IDEMPOTENCY_MISMATCH")
    # ...and as a new operation it has no capability: exact match only.
    other = intend(client, run_id, "c-2", resource="repo:acme/api:pull:482").body["operation_id"]
    refused = client.authorize(other, 1)
    assert (refused.status, refused.body["error"]) == (403, "DENY_NO_CAPABILITY")


def test_a_retry_after_the_capability_expired_is_refused(api_for, acme, leased):
    client, run_id = leased
    grant(client, run_id, max_calls=3)
    op = intend(client, run_id, "c-1", effect_class="PURE").body["operation_id"]
    client.authorize(op, 1)
    client.dispatch(op, 1)
    client.outcome(op, 1, "FAILED", error_code="HTTP_503")
    CapabilityBudget.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    retry = client.post(f"/operations/{op}/retry", {"fencing_token": 1})
    assert retry.body == {"attempt": 2, "phase": "PLANNED"}
    refused = client.authorize(op, 1)
    assert (refused.status, refused.body["error"]) == (403, "DENY_EXPIRED")


def test_a_child_run_cannot_get_more_than_its_parent_holds(api_for, acme, leased):
    client, parent = leased
    grant(client, parent, max_calls=3, actions=["comment", "read"])
    child = client.post("/runs", {"schema_version": 1, "parent_run_id": parent}).body["run_id"]
    client.acquire(child, "sub-agent")
    wider = grant(client, child, actions=["comment", "merge"])
    assert (wider.status, wider.body["error"]) == (403, "DENY_POLICY")
    more_calls = grant(client, child, max_calls=4)
    assert (more_calls.status, more_calls.body["error"]) == (403, "DENY_POLICY")
    assert grant(client, child, max_calls=2).status == 201
    parent_cap = CapabilityBudget.objects.get(run_id=parent)
    assert parent_cap.used_calls == 2  # delegated calls are gone from the parent
    assert grant(client, child, max_calls=2).status == 403  # only one left to give
    # And the parent cannot use the child's capability: capabilities are per run.
    op = intend(client, parent, "p-1", action="comment").body["operation_id"]
    assert client.authorize(op, 1).status == 200
    assert client.dispatch(op, 1).status == 200
    second = intend(client, parent, "p-2", action="comment").body["operation_id"]
    assert client.authorize(second, 1).body["error"] == "DENY_BUDGET"


def test_lease_lost_after_the_call_was_reserved_leaves_unknown_not_a_free_call(api_for, acme, leased):
    client, run_id = leased
    grant(client, run_id, max_calls=1)
    op = intend(client, run_id, "c-1").body["operation_id"]
    client.authorize(op, 1)
    client.dispatch(op, 1)  # the worker crashes right after
    expire(run_id)
    rescuer = api_for(acme)
    assert rescuer.acquire(run_id, "worker-b").body["fencing_token"] == 2
    assert Operation.objects.get(pk=op).phase == "UNKNOWN"
    assert CapabilityBudget.objects.get(run_id=run_id).used_calls == 1
    again = intend(rescuer, run_id, "c-2", token=2).body["operation_id"]
    assert rescuer.authorize(again, 2).body["error"] == "DENY_BUDGET"


def _dispatch_in_process(base_url, token, op_id, fencing_token, results):
    import requests

    response = requests.post(
        f"{base_url}/api/v1/operations/{op_id}/dispatch",
        json={"fencing_token": fencing_token},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    results.put((op_id, response.status_code, response.json().get("error")))


def test_sixteen_processes_racing_for_the_last_calls_get_exactly_the_limit(api_for, acme, live_server, leased):
    client, run_id = leased
    limit, racers = 3, 16
    grant(client, run_id, max_calls=limit)
    ops = []
    for n in range(racers):
        op = intend(client, run_id, f"race-{n}").body["operation_id"]
        assert client.authorize(op, 1).status == 200
        ops.append(op)
    # Forked processes that only speak HTTP; each request runs in its own server thread
    # and PostgreSQL transaction.
    context = mp.get_context("fork")
    results = context.Queue()
    procs = [
        context.Process(target=_dispatch_in_process, args=(live_server.url, acme.token, op, 1, results)) for op in ops
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    granted = [o for o in outcomes if o[1] == 200]
    assert len(granted) == limit, outcomes
    assert {o[2] for o in outcomes if o[1] != 200} == {"DENY_BUDGET"}
    capability = CapabilityBudget.objects.get(run_id=run_id)
    assert capability.used_calls == limit
    assert Operation.objects.filter(run_id=run_id, phase="DISPATCHED").count() == limit
