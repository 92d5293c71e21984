"""Cancellation and the maximum runtime over HTTP (issue 12, items 2 and 3): CANCELLING ->
CANCELLED, no new work from the cancel on, in-flight effects report until the grace ends
and become UNKNOWN with a case after it, children go with their parent, flow 5 order at the end."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.models import CapabilityBudget, Event, LeaseGrant, Operation, Run
from ledger.services.authority.policy import policy_change
from ledger.services.fence.ending import run_cancel, runs_enforce_limits
from ledger.tasks import enforce_run_limits_task
from tests.factories import make_worker
from tests.helpers import assert_chain_intact


def dispatched(client, run_id, key):
    op = client.intend(run_id, 1, key, effect_class="IDEMPOTENT").body["operation_id"]
    assert client.authorize(op, 1).status == 200
    assert client.dispatch(op, 1).status == 200
    return op


def renew(client, run_id, token=1):
    return client.post(f"/runs/{run_id}/lease/renew", {"owner_id": "worker-a", "fencing_token": token, "ttl_s": 30})


def types(run_id):
    return [e.type for e in assert_chain_intact(run_id)]


def test_cancel_with_nothing_in_flight_ends_the_run_at_once(leased):
    client, run_id = leased
    r = client.post(f"/runs/{run_id}/cancel", {"reason": "the user closed the task"})
    assert r.status == 200, r
    assert (r.body["status"], r.body["cancel"]["ending"], r.body["cancel"]["reason"]) == (
        "CANCELLED",
        "CANCELLED",
        "the user closed the task",
    )
    assert types(run_id)[-3:] == ["RUN_CANCELLING", "LEASE_CANCELLED", "RUN_CANCELLED"]
    assert LeaseGrant.objects.get(run_id=run_id).state == "RELEASED"
    # From now on every call of the old owner answers with the cancel.
    for response in (renew(client, run_id), client.intend(run_id, 1, "late")):
        assert (response.status, response.body["error"], response.body["run_status"]) == (
            409,
            "RUN_CANCELLED",
            "CANCELLED",
        ), response
    assert client.acquire(run_id, "worker-b").body["error"] == "RUN_CANCELLED"
    # Cancelling again changes nothing.
    before = Run.objects.get(pk=run_id).last_seq
    assert client.post(f"/runs/{run_id}/cancel", {"reason": "again"}).status == 200
    assert Run.objects.get(pk=run_id).last_seq == before


def test_cancel_while_an_operation_is_dispatched_keeps_its_outcome_path_until_the_grace(leased):
    client, run_id = leased
    op = dispatched(client, run_id, "deploy:1")
    waiting = client.intend(run_id, 1, "deploy:2", effect_class="IDEMPOTENT").body["operation_id"]
    assert client.authorize(waiting, 1).status == 200

    r = client.post(f"/runs/{run_id}/cancel", {"reason": "operator asked"})
    assert (r.status, r.body["status"]) == (200, "CANCELLING"), r
    # The heartbeat carries the news; new work is refused; the dispatched effect may report.
    heartbeat = renew(client, run_id)
    assert (heartbeat.status, heartbeat.body["run_status"]) == (200, "CANCELLING"), heartbeat
    assert heartbeat.body["cancel"]["reason"] == "operator asked"
    assert heartbeat.body["cancel"]["grace_until"]
    for refused in (client.intend(run_id, 1, "deploy:3"), client.dispatch(waiting, 1), client.authorize(waiting, 1)):
        assert (refused.status, refused.body["error"]) == (409, "RUN_CANCELLED"), refused
    assert Operation.objects.get(pk=waiting).phase == "AUTHORIZED"  # refused, not moved

    # The last in-flight outcome finishes the cancellation.
    assert client.outcome(op, 1, "CONFIRMED", provider_request_id="dep-1").status == 200
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.n_dispatched, run.n_confirmed) == ("CANCELLED", 0, 1)
    assert types(run_id)[-2:] == ["LEASE_CANCELLED", "RUN_CANCELLED"]


def test_past_the_grace_what_is_still_dispatched_becomes_unknown_with_a_case(leased):
    client, run_id = leased
    op = dispatched(client, run_id, "email:1")
    assert client.post(f"/runs/{run_id}/cancel", {"reason": "stop"}).body["status"] == "CANCELLING"
    Run.objects.filter(pk=run_id).update(cancel_grace_until=timezone.now() - timedelta(seconds=1))

    result = runs_enforce_limits()

    assert (result.timed_out, result.finished) == (0, 1)
    assert Run.objects.get(pk=run_id).status == "CANCELLED"
    assert Operation.objects.get(pk=op).phase == "UNKNOWN"
    assert ReconciliationCase.objects.get(operation_id=op).reason == "RUN_CANCELLED"
    late = client.outcome(op, 1, "CONFIRMED", provider_request_id="dep-late")
    assert (late.status, late.body["error"]) == (409, "RUN_CANCELLED"), late
    assert Operation.objects.get(pk=op).phase == "UNKNOWN"  # never guessed away


def test_cancel_reaches_the_children_and_their_children(api_for, acme):
    client = api_for(acme)
    parent = client.create_run()
    child = client.post("/runs", {"schema_version": 1, "parent_run_id": parent}).body["run_id"]
    grandchild = client.post("/runs", {"schema_version": 1, "parent_run_id": child}).body["run_id"]
    finished = client.post("/runs", {"schema_version": 1, "parent_run_id": parent}).body["run_id"]
    for run_id in (parent, child, grandchild, finished):
        assert client.acquire(run_id, "worker-a").status == 200
    assert client.post(f"/runs/{finished}/complete", {"fencing_token": 1}).status == 200
    op = dispatched(client, grandchild, "g:1")

    r = client.post(f"/runs/{parent}/cancel", {"reason": "task abandoned"})

    assert r.status == 200, r
    runs = {str(run.pk): run for run in Run.objects.filter(pk__in=[parent, child, grandchild, finished])}
    assert [runs[pk].status for pk in (parent, child, grandchild, finished)] == [
        "CANCELLED",
        "CANCELLED",
        "CANCELLING",  # its effect is in flight
        "COMPLETED",  # a finished child is left as it is
    ]
    assert (runs[child].cancel_reason, runs[grandchild].cancel_reason) == ("parent cancelled", "parent cancelled")
    assert client.outcome(op, 1, "FAILED", error_code="E").status == 200
    assert Run.objects.get(pk=grandchild).status == "CANCELLED"


def test_only_the_runs_worker_or_its_parents_may_cancel_it(api_for, acme, outsider):
    client = api_for(acme)
    parent = client.create_run()
    child = client.post("/runs", {"schema_version": 1, "parent_run_id": parent}).body["run_id"]
    assert client.acquire(parent, "worker-a").status == 200
    other = api_for(make_worker("acme", "worker-2"))
    assert other.acquire(child, "worker-b").status == 200

    # Another worker of the tenant holding neither lease is refused; so is another tenant.
    bystander = api_for(make_worker("acme", "worker-3"))
    refused = bystander.post(f"/runs/{parent}/cancel", {"reason": "not mine"})
    assert (refused.status, refused.body["error"]) == (403, "FORBIDDEN"), refused
    assert api_for(outsider).post(f"/runs/{parent}/cancel", {"reason": "x"}).status == 404
    assert Run.objects.get(pk=parent).status == "ACTIVE"
    # The parent's worker may cancel the child.
    assert client.post(f"/runs/{child}/cancel", {"reason": "sub-task not needed"}).body["status"] == "CANCELLED"
    assert Run.objects.get(pk=parent).status == "ACTIVE"


@pytest.mark.parametrize(
    ("body", "field"),
    [({"reason": ""}, "reason"), ({"reason": "   "}, "reason"), ({"reason": "x" * 501}, "reason"), ({}, "reason")],
)
def test_a_cancel_without_a_usable_reason_is_refused_naming_the_field(leased, body, field):
    client, run_id = leased
    r = client.post(f"/runs/{run_id}/cancel", body)
    assert r.status == 422, r
    assert field in str(r.body["fields"])
    assert Run.objects.get(pk=run_id).status == "ACTIVE"


def test_the_end_of_a_run_revokes_its_authority_after_the_status_and_before_the_resources(leased, acme):
    client, run_id = leased
    capability = client.post(
        f"/runs/{run_id}/capabilities",
        {"fencing_token": 1, "tool": "email", "actions": ["send"], "resources": ["*"], "max_calls": 3, "ttl_s": 600},
    )
    assert capability.status == 201, capability
    session = client.post(
        f"/runs/{run_id}/resources",
        {"fencing_token": 1, "kind": "browser_session", "provider": "sandbox", "handle": "sess-flow5"},
    )
    assert session.status == 201, session

    assert client.post(f"/runs/{run_id}/complete", {"fencing_token": 1}).status == 200

    ordered = types(run_id)
    end = ordered.index("RUN_COMPLETED")
    assert ordered[end + 1 : end + 3] == ["CAPABILITIES_REVOKED", "RESOURCE_RELEASE_REQUESTED"]
    assert CapabilityBudget.objects.get(pk=capability.body["capability_id"]).expires_at <= timezone.now()
    completed = Event.objects.get(run_id=run_id, type="RUN_COMPLETED")
    assert completed.fields["instance_state"] == "REAPING"  # its session is still open


def test_a_run_past_its_maximum_runtime_times_out_through_the_cancellation_path(api_for, acme):
    client = api_for(acme)
    created = client.post("/runs", {"schema_version": 1, "max_runtime_s": 60})
    assert created.status == 201, created
    run_id = created.body["run_id"]
    assert client.acquire(run_id, "worker-a").status == 200
    op = dispatched(client, run_id, "t:1")
    Run.objects.filter(pk=run_id).update(deadline_at=timezone.now() - timedelta(seconds=1))

    heartbeat = renew(client, run_id)  # the worker learns it on its next heartbeat

    assert (heartbeat.status, heartbeat.body["run_status"]) == (200, "CANCELLING"), heartbeat
    assert heartbeat.body["cancel"]["ending"] == "TIMED_OUT"
    assert client.outcome(op, 1, "CONFIRMED", provider_request_id="t-1").status == 200
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.cancel_requested_by) == ("TIMED_OUT", "system:run-limits")
    assert types(run_id)[-1] == "RUN_TIMED_OUT"


def test_the_limits_job_times_out_runs_nobody_renews(api_for, acme):
    client = api_for(acme)
    run_id = client.create_run()
    Run.objects.filter(pk=run_id).update(deadline_at=timezone.now() - timedelta(seconds=1))
    assert runs_enforce_limits().timed_out == 1
    assert Run.objects.get(pk=run_id).status == "TIMED_OUT"
    assert runs_enforce_limits().timed_out == 0  # idempotent


def test_a_run_asks_for_less_runtime_than_the_policy_never_more(api_for, acme):
    client = api_for(acme)
    policy_change(tenant=acme.tenant, document={"max_runtime_s": 600}, reason="short tasks only", changed_by="admin")
    refused = client.post("/runs", {"schema_version": 1, "max_runtime_s": 601})
    assert (refused.status, refused.body["error"]) == (403, "DENY_POLICY") and "max_runtime_s" in str(refused.body), (
        refused
    )
    run_id = client.create_run()
    run = Run.objects.get(pk=run_id)
    assert timedelta(seconds=590) < run.deadline_at - run.created_at <= timedelta(seconds=601)
    child = client.post("/runs", {"schema_version": 1, "parent_run_id": run_id, "max_runtime_s": 500}).body["run_id"]
    assert Run.objects.get(pk=child).deadline_at <= run.deadline_at  # a child never outlives its parent's deadline


def test_an_operator_cancels_from_a_service_call_with_their_name(leased, acme):
    _, run_id = leased
    run = run_cancel(tenant=acme.tenant, run_id=run_id, reason="runaway loop", actor="user:olga")
    assert (run.status, run.cancel_requested_by) == ("CANCELLED", "user:olga")


def test_the_limits_command_and_task_time_out_overdue_runs(api_for, acme):
    client = api_for(acme)
    first, second = client.create_run(), client.create_run()
    Run.objects.filter(pk__in=[first, second]).update(deadline_at=timezone.now() - timedelta(seconds=1))
    out = StringIO()
    call_command("enforce_run_limits", "--batch-size", "1", stdout=out)
    assert out.getvalue().strip() == "2 runs timed out; 0 cancellations finished"
    assert enforce_run_limits_task.apply().get() == {"timed_out": 0, "cancels_finished": 0}
    assert set(Run.objects.filter(pk__in=[first, second]).values_list("status", flat=True)) == {"TIMED_OUT"}
