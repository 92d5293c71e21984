"""POST /runs/{run_id}/effects (issue 37 item 2, issue 41 "fewer round trips"): one call
intends, authorizes and dispatches when nothing waits for a person. Its answers, the refusal
codes of the three separate calls reaching the caller unchanged, a replay that dispatches
nothing twice, the approval path, and two callers racing one key."""

import pytest

from approvals.services.approvals import approval_decide
from ledger.models import Event, Operation, Run
from ledger.services.upgrades.restore import effects_allow, effects_hold
from tests.factories import credential, credential_lease, expire, make_worker, set_cost_policy, set_policy
from tests.helpers import assert_chain_intact, run_concurrently

EMAIL = {"tool": "email", "action": "send", "resource": "mailto:ops@example.com", "effect_class": "IDEMPOTENT"}
PAYMENT = {"tool": "payments", "action": "charge", "resource": "customer:881", "effect_class": "NON_RETRYABLE"}


def start(client, run_id, key, token=1, **overrides):
    return client.post(
        f"/runs/{run_id}/effects", {"fencing_token": token, **EMAIL, "idempotency_key": key, **overrides}
    )


def transitions(run_id) -> list[str]:
    """The operation events of the run's chain, in order."""
    return list(
        Event.objects.filter(run_id=run_id, type__startswith="OPERATION_")
        .order_by("seq")
        .values_list("type", flat=True)
    )


def test_one_call_intends_authorizes_and_dispatches(leased):
    client, run_id = leased
    started = start(client, run_id, "mail:1")
    assert started.status == 201, started
    op = Operation.objects.get(idempotency_key="mail:1")
    assert started.body == {
        "operation_id": str(op.pk),
        "phase": "DISPATCHED",
        "attempt": 1,
        "schema_version": op.schema_version,
        "approval_id": None,
        "dispatched": True,
        "reservation_id": None,  # no estimate and no cost limit: nothing reserved
        "levers": None,  # the breaker is NORMAL
    }
    assert (op.phase, op.fencing_token) == ("DISPATCHED", 1)
    assert transitions(run_id) == ["OPERATION_PLANNED", "OPERATION_AUTHORIZED", "OPERATION_DISPATCHED"]
    assert_chain_intact(run_id)


def test_a_replay_answers_the_same_operation_and_dispatches_nothing_again(leased):
    client, run_id = leased
    first = start(client, run_id, "mail:2")
    again = start(client, run_id, "mail:2")
    assert (first.status, again.status) == (201, 200)
    # DISPATCHED, but by an earlier call: whether that effect happened is not this call's to know
    assert again.body == {**first.body, "dispatched": False} and first.body["dispatched"] is True
    op_id = first.body["operation_id"]
    assert client.outcome(op_id, 1, "CONFIRMED", provider_request_id="msg-2").status == 200
    after = start(client, run_id, "mail:2")
    assert (after.status, after.body["phase"], after.body["operation_id"]) == (200, "CONFIRMED", op_id)
    assert transitions(run_id).count("OPERATION_DISPATCHED") == 1
    assert_chain_intact(run_id)


def test_the_call_continues_an_operation_the_separate_calls_left_planned_or_authorized(leased):
    client, run_id = leased
    planned = client.intend(run_id, 1, "mail:3", **EMAIL).body["operation_id"]
    authorized = client.intend(run_id, 1, "mail:4", **EMAIL).body["operation_id"]
    assert client.authorize(authorized, 1).status == 200
    for key, op_id in (("mail:3", planned), ("mail:4", authorized)):
        continued = start(client, run_id, key)
        assert (continued.status, continued.body["operation_id"], continued.body["phase"]) == (200, op_id, "DISPATCHED")
        assert continued.body["dispatched"] is True  # this call dispatched what the others left
    assert transitions(run_id).count("OPERATION_DISPATCHED") == 2
    assert transitions(run_id).count("OPERATION_AUTHORIZED") == 2


def test_a_caller_that_cannot_read_the_record_is_not_taken_past_the_intent(leased):
    client, run_id = leased
    unread = start(client, run_id, "mail:21", reads_schema_versions=[99])
    assert (unread.status, unread.body["phase"]) == (201, "PLANNED")
    version = unread.body["schema_version"]
    assert version != 99 and transitions(run_id) == ["OPERATION_PLANNED"]
    read = start(client, run_id, "mail:21", reads_schema_versions=[version])
    assert (read.status, read.body["phase"]) == (200, "DISPATCHED")


# --- refusals: the codes of the separate calls -------------------------------------------


def test_a_stale_token_is_refused_and_recorded_with_nothing_intended(leased):
    client, run_id = leased
    refused = start(client, run_id, "mail:5", token=7)
    assert (refused.status, refused.body["error"], refused.body["reason"]) == (409, "STALE_TOKEN", "token_changed")
    expire(run_id)
    late = start(client, run_id, "mail:5")
    assert (late.status, late.body["error"], late.body["reason"]) == (409, "STALE_TOKEN", "expired")
    assert not Operation.objects.filter(run_id=run_id).exists()
    rejected = Event.objects.filter(run_id=run_id, type="STALE_TOKEN_REJECTED")
    assert [e.fields["attempted"] for e in rejected.order_by("seq")] == ["operation.intend"] * 2
    assert Run.objects.get(pk=run_id).stale_rejections == 2


def test_the_old_owner_is_refused_once_another_owner_took_the_run(api_for, acme, leased):
    client, run_id = leased
    expire(run_id)
    other = api_for(make_worker("acme", "worker-2"))
    assert other.acquire(run_id, "worker-b").body["fencing_token"] == 2
    refused = start(client, run_id, "mail:6")
    assert (refused.status, refused.body["error"]) == (409, "STALE_TOKEN")
    # The new owner replaying the same intent gets the operation and its dispatch.
    taken = start(other, run_id, "mail:6", token=2)
    assert (taken.status, taken.body["phase"]) == (201, "DISPATCHED")
    assert Operation.objects.get(pk=taken.body["operation_id"]).fencing_token == 2


def test_an_intent_refused_keeps_its_code(leased):
    client, run_id = leased
    assert start(client, run_id, "mail:7").status == 201
    mismatch = start(client, run_id, "mail:7", resource="mailto:other@example.com")
    assert (mismatch.status, mismatch.body["error"]) == (422, "IDEMPOTENCY_MISMATCH")
    unknown = start(client, "00000000-0000-0000-0000-000000000000", "mail:8")
    assert (unknown.status, unknown.body["error"]) == (404, "NOT_FOUND")
    invalid = start(client, run_id, "mail:9", effect_class="SOMETIMES")
    assert (invalid.status, invalid.body["error"]) == (422, "VALIDATION_ERROR")
    assert invalid.body["fields"][0]["field"] == "effect_class"


def test_a_declared_class_the_tool_contract_contradicts_is_refused(acme, leased):
    client, run_id = leased
    set_policy(acme.tenant, tool_contracts=[{"tool": "payments", "action": "charge", "effect_class": "NON_RETRYABLE"}])
    refused = start(client, run_id, "pay:1", **{**PAYMENT, "effect_class": "PURE"})
    assert (refused.status, refused.body["error"]) == (422, "EFFECT_CLASS_MISMATCH")
    assert not Operation.objects.filter(run_id=run_id).exists()


def test_another_tenants_run_is_not_found(api_for, outsider, leased):
    _, run_id = leased
    refused = start(api_for(outsider), run_id, "mail:10")
    assert (refused.status, refused.body["error"]) == (404, "NOT_FOUND")


def test_a_policy_refusal_at_authorize_keeps_the_intent_denied(acme, leased):
    client, run_id = leased
    set_policy(acme.tenant, rules=[{"tool": "search", "actions": ["*"], "resources": ["*"]}])
    refused = start(client, run_id, "mail:11")
    assert (refused.status, refused.body["error"], refused.body["decision"]) == (403, "DENY_POLICY", "DENY_POLICY")
    op = Operation.objects.get(idempotency_key="mail:11")
    assert op.phase == "DENIED"
    # The same call again answers the decided phase; nothing is authorized or dispatched.
    again = start(client, run_id, "mail:11")
    assert (again.status, again.body["phase"], again.body["operation_id"]) == (200, "DENIED", str(op.pk))
    assert transitions(run_id) == ["OPERATION_PLANNED", "OPERATION_DENIED"]


def test_a_capability_required_and_missing_is_refused(acme, leased):
    client, run_id = leased
    set_policy(acme.tenant, require_capability=True)
    refused = start(client, run_id, "mail:12")
    assert (refused.status, refused.body["error"]) == (403, "DENY_NO_CAPABILITY")


def test_a_spent_capability_refuses_the_second_effect_with_its_budget(acme, leased):
    client, run_id = leased
    granted = client.post(
        f"/runs/{run_id}/capabilities",
        {
            "fencing_token": 1,
            "tool": "email",
            "actions": ["send"],
            "resources": [EMAIL["resource"]],
            "max_calls": 1,
            "ttl_s": 600,
        },
    )
    assert granted.status == 201, granted
    assert start(client, run_id, "mail:13").body["phase"] == "DISPATCHED"
    refused = start(client, run_id, "mail:14")
    assert (refused.status, refused.body["error"], refused.body["budget"]) == (403, "DENY_BUDGET", "capability:calls")


def test_a_cost_refusal_at_dispatch_leaves_the_operation_denied_after_its_authorization(acme, leased):
    client, run_id = leased
    set_cost_policy(acme.tenant, run=3)
    refused = start(client, run_id, "llm:1", tool="llm", action="complete", resource="model:x", estimated_cost_cents=5)
    assert (refused.status, refused.body["error"]) == (403, "DENY_BUDGET")
    assert Operation.objects.get(idempotency_key="llm:1").phase == "DENIED"
    assert transitions(run_id) == ["OPERATION_PLANNED", "OPERATION_AUTHORIZED", "OPERATION_DENIED"]


def test_a_named_credential_lease_is_checked_and_kept_on_the_dispatch(acme, leased):
    client, run_id = leased
    set_policy(acme.tenant, require_credential=True)
    run = Run.objects.get(pk=run_id)
    credential(acme.tenant)
    lease = credential_lease(acme, run, 1, actions=["send"], resources=[EMAIL["resource"]])
    refused = start(client, run_id, "mail:15")
    assert (refused.status, refused.body["error"]) == (403, "DENY_POLICY")
    started = start(client, run_id, "mail:16", credential_lease_id=str(lease.pk))
    assert (started.status, started.body["phase"]) == (201, "DISPATCHED")
    assert Operation.objects.get(idempotency_key="mail:16").credential_lease_id == lease.pk
    unknown = start(client, run_id, "mail:17", credential_lease_id="not-a-lease")
    assert (unknown.status, unknown.body["error"]) == (404, "NOT_FOUND")


def test_held_effects_refuse_the_call_and_the_same_call_proceeds_once_allowed(acme, leased):
    client, run_id = leased
    effects_hold(by="ops", tenants=["acme"], reason="restored from backup")
    held = start(client, run_id, "mail:18")
    assert (held.status, held.body["error"]) == (409, "EFFECTS_HELD")
    assert Operation.objects.get(idempotency_key="mail:18").phase == "PLANNED"  # the intent is kept
    effects_allow(tenant="acme", reason="checked the restore", name="ops")
    allowed = start(client, run_id, "mail:18")
    assert (allowed.status, allowed.body["phase"]) == (200, "DISPATCHED")


def test_a_cancelled_run_and_a_draining_worker_take_no_effect(api_for, acme, leased):
    client, run_id = leased
    assert client.post(f"/runs/{run_id}/cancel", {"reason": "not needed"}).status == 200
    cancelled = start(client, run_id, "mail:19")
    assert (cancelled.status, cancelled.body["error"]) == (409, "RUN_CANCELLED")
    draining = api_for(make_worker("acme", "worker-3"))
    other_run = draining.leased_run()
    assert draining.post("/workers/me/drain", {"deadline_s": 60}).status == 200
    refused = start(draining, other_run, "mail:20")
    assert (refused.status, refused.body["error"]) == (409, "WORKER_DRAINING")
    assert not Operation.objects.filter(idempotency_key__in=["mail:19", "mail:20"]).exists()


# --- a person decides ---------------------------------------------------------------------


def test_an_effect_that_needs_a_person_waits_then_the_same_call_dispatches(acme, leased):
    client, run_id = leased
    set_policy(acme.tenant, human_approval_tools=["payments"])
    asked = start(client, run_id, "pay:2", **PAYMENT)
    assert asked.status == 202, asked
    op = Operation.objects.get(idempotency_key="pay:2")
    assert asked.body == {
        "operation_id": str(op.pk),
        "phase": "PENDING_APPROVAL",
        "attempt": 1,
        "schema_version": op.schema_version,
        "approval_id": asked.body["approval_id"],
        "dispatched": False,
        "reservation_id": None,
        "levers": None,
    }
    again = start(client, run_id, "pay:2", **PAYMENT)
    assert (again.status, again.body["approval_id"]) == (202, asked.body["approval_id"])  # no second request
    approval_decide(approval_id=asked.body["approval_id"], approve=True, decided_by="alice", reason="checked")
    approved = start(client, run_id, "pay:2", **PAYMENT)
    assert (approved.status, approved.body["phase"], approved.body["approval_id"]) == (200, "DISPATCHED", None)
    assert approved.body["dispatched"] is True
    assert client.get(f"/approvals/{asked.body['approval_id']}").body["status"] == "USED"
    assert transitions(run_id) == [
        "OPERATION_PLANNED",
        "OPERATION_PENDING_APPROVAL",
        "OPERATION_AUTHORIZED",
        "OPERATION_DISPATCHED",
    ]


# --- two callers, one key -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_callers_racing_one_key_get_one_operation_and_one_dispatch(api_for, acme):
    client = api_for(acme)
    run_id = client.leased_run()
    callers = [api_for(acme) for _ in range(4)]  # a session each: four connections

    answers = run_concurrently(lambda i: start(callers[i], run_id, "mail:race"), 4)

    assert all(not isinstance(a, BaseException) for a in answers), answers
    assert sorted(a.status for a in answers) == [200, 200, 200, 201], answers
    assert {a.body["operation_id"] for a in answers} == {str(Operation.objects.get(idempotency_key="mail:race").pk)}
    assert {a.body["phase"] for a in answers} == {"DISPATCHED"}
    assert transitions(run_id) == ["OPERATION_PLANNED", "OPERATION_AUTHORIZED", "OPERATION_DISPATCHED"]
    assert_chain_intact(run_id)
