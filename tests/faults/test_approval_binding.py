"""Approvals are bound to the exact operation, attempt, args digest and the fencing token
current when they were asked: a change of lease owner voids them, they are used once, and an
expired one stays EXPIRED — a timeout never approves anything."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services.approvals import approval_decide, approvals_expire
from ledger.errors import WrongPhase
from ledger.models import Event, Operation
from ledger.services.authority.policy import policy_change
from tests.factories import expire
from tests.helpers import runs_held_elsewhere


@pytest.fixture
def payments_need_a_person(acme):
    policy_change(
        tenant=acme.tenant,
        document={"human_approval_tools": ["payments"]},
        changed_by="admin",
        reason="every payment is approved by a person",
    )


def charge(client, run_id, key, token=1, effect_class="NON_RETRYABLE"):
    return client.intend(
        run_id,
        token,
        key,
        tool="payments",
        action="charge",
        resource="customer:881",
        effect_class=effect_class,
        args_digest="sha256:abc123",
    ).body["operation_id"]


def test_another_tenants_approval_and_an_id_that_is_no_uuid_are_404(
    api_for, acme, outsider, payments_need_a_person, leased
):
    client, run_id = leased
    approval_id = client.authorize(charge(client, run_id, "inv-18"), 1).body["approval_id"]
    assert client.get(f"/approvals/{approval_id}").body["status"] == "PENDING"
    seen = api_for(outsider).get(f"/approvals/{approval_id}")
    assert (seen.status, seen.body["error"]) == (404, "NOT_FOUND")
    malformed = client.get("/approvals/not-an-id")  # names nothing (ledger.errors.parse_id)
    assert (malformed.status, malformed.body["error"]) == (404, "NOT_FOUND")


def test_an_approved_operation_proceeds_once(api_for, acme, payments_need_a_person, leased):
    client, run_id = leased
    op = charge(client, run_id, "inv-17")
    asked = client.authorize(op, 1)
    assert asked.status == 202 and asked.body["decision"] == "APPROVAL_REQUIRED"
    approval_id = asked.body["approval_id"]
    assert Operation.objects.get(pk=op).phase == "PENDING_APPROVAL"
    assert client.get(f"/approvals/{approval_id}").body["status"] == "PENDING"
    # Asking again does not open a second request.
    assert client.authorize(op, 1).body["approval_id"] == approval_id

    approval_decide(approval_id=approval_id, approve=True, decided_by="alice", reason="invoice 17 checked")
    assert client.get(f"/approvals/{approval_id}").body["status"] == "APPROVED"
    assert client.authorize(op, 1).body == {"decision": "ALLOW", "phase": "AUTHORIZED"}
    assert client.dispatch(op, 1).status == 200
    assert client.get(f"/approvals/{approval_id}").body["status"] == "USED"
    decided = Event.objects.get(run_id=run_id, type="APPROVAL_APPROVED")
    assert (decided.actor, decided.fields["reason"]) == ("user:alice", "invoice 17 checked")


def test_an_approval_asked_under_token_t_cannot_be_used_under_t_plus_one(api_for, acme, payments_need_a_person, leased):
    client, run_id = leased
    op = charge(client, run_id, "inv-18")
    approval_id = client.authorize(op, 1).body["approval_id"]
    approval_decide(approval_id=approval_id, approve=True, decided_by="alice", reason="ok")

    expire(run_id)
    rescuer = api_for(acme)
    assert rescuer.acquire(run_id, "worker-b").body["fencing_token"] == 2
    assert ApprovalRequest.objects.get(pk=approval_id).status == "VOID"

    again = rescuer.authorize(op, 2)
    assert again.status == 202 and again.body["approval_id"] != approval_id
    assert ApprovalRequest.objects.get(pk=again.body["approval_id"]).fencing_token == 2


def test_an_approval_is_used_once_even_for_a_retry(api_for, acme, leased):
    client, run_id = leased
    op = charge(client, run_id, "inv-19")  # payments need no person here; retries of NON_RETRYABLE do
    client.authorize(op, 1)
    client.dispatch(op, 1)
    client.outcome(op, 1, "FAILED", error_code="CARD_DECLINED")
    asked = client.post(f"/operations/{op}/retry", {"fencing_token": 1})
    assert asked.status == 202
    approval_decide(
        approval_id=asked.body["approval_id"], approve=True, decided_by="bob", reason="customer updated card"
    )
    assert client.post(f"/operations/{op}/retry", {"fencing_token": 1}).body == {"attempt": 2, "phase": "PLANNED"}
    assert ApprovalRequest.objects.get(pk=asked.body["approval_id"]).status == "USED"

    client.authorize(op, 1)
    client.dispatch(op, 1)
    client.outcome(op, 1, "FAILED", error_code="CARD_DECLINED")
    second = client.post(f"/operations/{op}/retry", {"fencing_token": 1})
    assert second.status == 202 and second.body["approval_id"] != asked.body["approval_id"]
    assert Operation.objects.get(pk=op).attempt == 2


def test_an_expired_approval_stays_expired(api_for, acme, payments_need_a_person, leased):
    client, run_id = leased
    op = charge(client, run_id, "inv-20")
    approval_id = client.authorize(op, 1).body["approval_id"]
    ApprovalRequest.objects.filter(pk=approval_id).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert approvals_expire() == 1
    assert client.get(f"/approvals/{approval_id}").body["status"] == "EXPIRED"
    with pytest.raises(WrongPhase, match="EXPIRED"):
        approval_decide(approval_id=approval_id, approve=True, decided_by="alice", reason="sorry, late")
    assert ApprovalRequest.objects.get(pk=approval_id).status == "EXPIRED"
    # The operation is still waiting: a new request, never an approval by timeout.
    assert Operation.objects.get(pk=op).phase == "PENDING_APPROVAL"
    renewed = client.authorize(op, 1)
    assert renewed.status == 202 and renewed.body["approval_id"] != approval_id
    assert Event.objects.filter(run_id=run_id, type="APPROVAL_EXPIRED").count() == 1


def test_a_denied_approval_denies_the_operation(api_for, acme, payments_need_a_person, leased):
    client, run_id = leased
    op = charge(client, run_id, "inv-21")
    approval_id = client.authorize(op, 1).body["approval_id"]
    approval_decide(approval_id=approval_id, approve=False, decided_by="alice", reason="duplicate invoice")
    answer = client.get(f"/approvals/{approval_id}").body
    assert (answer["status"], answer["reason"]) == ("DENIED", "duplicate invoice")
    operation = Operation.objects.get(pk=op)
    assert (operation.phase, operation.decision_code) == ("DENIED", "DENY_POLICY")
    refused = client.authorize(op, 1)
    assert (refused.status, refused.body["error"]) == (409, "WRONG_PHASE")  # never silently re-authorized


def test_a_late_yes_on_a_request_past_its_expiry_marks_it_expired(api_for, acme, payments_need_a_person, leased):
    client, run_id = leased
    op = charge(client, run_id, "inv-22")
    approval_id = client.authorize(op, 1).body["approval_id"]
    ApprovalRequest.objects.filter(pk=approval_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(WrongPhase, match="EXPIRED"):  # before the expiry job got to it
        approval_decide(approval_id=approval_id, approve=True, decided_by="alice", reason="late")
    assert ApprovalRequest.objects.get(pk=approval_id).status == "EXPIRED"
    assert client.authorize(op, 1).status == 202


def test_the_expiry_job_and_command_are_safe_to_repeat(api_for, acme, payments_need_a_person, capsys, leased):
    from django.core.management import call_command

    from approvals.tasks import expire_approvals_task

    client, run_id = leased
    op = charge(client, run_id, "inv-23")
    approval_id = client.authorize(op, 1).body["approval_id"]
    ApprovalRequest.objects.filter(pk=approval_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert expire_approvals_task.apply().get() == {"expired": 1}
    call_command("expire_approvals")
    assert "expired 0 approval request(s)" in capsys.readouterr().out
    assert Event.objects.filter(run_id=run_id, type="APPROVAL_EXPIRED").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_expiry_job_looks_past_approvals_whose_runs_are_busy_elsewhere(api_for, acme, payments_need_a_person):
    """Two copies at once (``expire_approvals --processes 2``) split the backlog: when every
    run of a batch is locked by the other copy, this one reads on past those approvals
    instead of ending its pass. Here another connection holds the runs of the 3 oldest."""
    asked = []  # (approval id, run id), oldest expiry first
    client = api_for(acme)
    for i in range(9):
        run_id = client.leased_run()
        op = charge(client, run_id, f"inv-busy-{i}")
        asked.append((client.authorize(op, 1).body["approval_id"], run_id))
    now = timezone.now()
    for age, (approval_id, _) in enumerate(asked):
        ApprovalRequest.objects.filter(pk=approval_id).update(expires_at=now - timedelta(minutes=60 - age))
    batches = []
    with runs_held_elsewhere([run_id for _, run_id in asked[:3]]):
        expired = approvals_expire(batch_size=3, progress=lambda count, n: batches.append((count, n)))

    assert expired == 6
    assert batches == [(3, 1), (6, 2)]
    statuses = {str(pk): status for pk, status in ApprovalRequest.objects.values_list("pk", "status")}
    assert [statuses[a] for a, _ in asked] == ["PENDING"] * 3 + ["EXPIRED"] * 6
    assert approvals_expire(batch_size=3) == 3  # the next pass takes them
    assert Event.objects.filter(run_id__in=[r for _, r in asked], type="APPROVAL_EXPIRED").count() == 9
