"""Tool contracts at intent (ledger/services/reconciliation/contracts.py): the side-effect
class, provider, worst-case cost and reconciler come from the tenant's contract, not from the
worker's label; the DEGRADED breaker trusts the contract; decisions record the digest of the
policy they were made under."""

import pytest

from ledger.errors import ApprovalRequired, Denied, EffectClassMismatch, InvalidInput
from ledger.models import Event, Operation, Tenant, TenantPolicy
from ledger.policy import policy_digest
from ledger.services.authority.policy import policy_change
from ledger.services.core.intent import Intent
from ledger.services.fence import operations
from tests.factories import leased_run, set_cost_policy
from tests.ledger.authority.costs import reserve

pytestmark = pytest.mark.django_db

CONTRACTS = [
    {"tool": "search", "action": "*", "effect_class": "PURE"},
    {
        "tool": "payments",
        "action": "charge",
        "effect_class": "NON_RETRYABLE",
        "provider": "sandbox-payments",
        "reconciler": "sandbox-payments",
        "worst_case_cost_cents": 5000,
    },
    {"tool": "payments", "action": "refund", "effect_class": "IDEMPOTENT", "human_approval": True},
]


def with_contracts(tenant, unknown="WORKER_DECLARED", **extra):
    policy_change(
        tenant=tenant,
        document={"tool_contracts": CONTRACTS, "unknown_tool_class": unknown, **extra},
        changed_by="test",
        reason="contracts for a test",
    )
    tenant.refresh_from_db()


def intend(worker, run, token, key, tool, action, **fields):
    worker.tenant.refresh_from_db()  # the policy version, as the worker's next request reads it
    op, _ = operations.operation_intend(
        worker=worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(tool=tool, action=action, resource="r", idempotency_key=key, **fields),
    )
    return op


def test_an_intent_takes_class_provider_worst_case_and_reconciler_from_the_contract(acme):
    with_contracts(acme.tenant)
    run, token = leased_run(acme.worker)

    op = intend(acme.worker, run, token, "k1", "payments", "charge", estimated_cost_cents=1200)

    assert (op.effect_class, op.provider, op.reconciler) == ("NON_RETRYABLE", "sandbox-payments", "sandbox-payments")
    assert op.estimated_cost_cents == 5000  # the worst case, not the worker's lower guess
    planned = Event.objects.get(run=run, type="OPERATION_PLANNED")
    assert planned.fields["effect_class"] == "NON_RETRYABLE" and planned.fields["reconciler"] == "sandbox-payments"


def test_a_worker_declaring_pure_for_a_non_retryable_tool_is_refused_and_nothing_is_written(acme):
    with_contracts(acme.tenant)
    run, token = leased_run(acme.worker)
    before = Event.objects.filter(run=run).count()

    with pytest.raises(EffectClassMismatch) as refused:
        intend(acme.worker, run, token, "k2", "payments", "charge", effect_class="PURE")

    assert refused.value.status == 422
    assert refused.value.extra["fields"][0]["field"] == "effect_class"
    assert refused.value.extra["contract"] == "NON_RETRYABLE"
    assert not Operation.objects.filter(idempotency_key="k2").exists()
    assert Event.objects.filter(run=run).count() == before


def test_the_mismatch_reaches_the_worker_over_http_with_its_code(api_for, acme):
    with_contracts(acme.tenant)
    client = api_for(acme)
    run_id = client.create_run()
    token = client.acquire(run_id, "worker-a").body["fencing_token"]

    refused = client.intend(run_id, token, "k3", tool="payments", action="charge", effect_class="PURE")
    taken = client.intend(run_id, token, "k4", tool="search", action="web", effect_class=None)

    assert refused.status == 422 and refused.body["error"] == "EFFECT_CLASS_MISMATCH"
    assert refused.body["fields"][0]["field"] == "effect_class"
    assert taken.status == 201
    op = client.get(f"/operations/{taken.body['operation_id']}").body
    assert op["effect_class"] == "PURE" and op["reconciler"] == ""


def test_the_starter_policy_takes_the_declared_class_for_a_tool_without_contract(acme):
    run, token = leased_run(acme.worker)
    op = intend(acme.worker, run, token, "k5", "email", "send", effect_class="IDEMPOTENT")
    assert op.effect_class == "IDEMPOTENT"
    with pytest.raises(InvalidInput) as missing:
        intend(acme.worker, run, token, "k6", "email", "send")
    assert missing.value.extra["fields"][0]["field"] == "effect_class"


def test_a_policy_may_refuse_or_classify_tools_without_a_contract(acme):
    with_contracts(acme.tenant, unknown="REFUSE")
    run, token = leased_run(acme.worker)
    with pytest.raises(Denied) as refused:
        intend(acme.worker, run, token, "k7", "email", "send", effect_class="PURE")
    assert refused.value.code == "DENY_POLICY"

    with_contracts(acme.tenant, unknown="NON_RETRYABLE")
    assert intend(acme.worker, run, token, "k8", "email", "send").effect_class == "NON_RETRYABLE"
    with pytest.raises(EffectClassMismatch):
        intend(acme.worker, run, token, "k9", "email", "send", effect_class="PURE")


def test_degraded_lets_only_the_contracts_pure_tools_through(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    # Intended as PURE by the worker's own label, before any contract named the tool.
    legacy = intend(acme.worker, run, token, "legacy", "payments", "charge", effect_class="PURE")
    filler = intend(acme.worker, run, token, "filler", "llm", "complete", effect_class="IDEMPOTENT")
    Operation.objects.filter(pk=filler.pk).update(estimated_cost_cents=900)
    reserve(acme.tenant, filler)  # 90 % of the tenant limit: DEGRADED
    document = {**TenantPolicy.objects.get(tenant=acme.tenant, version=acme.tenant.policy_version).document}
    document.pop("starter", None)
    policy_change(tenant=acme.tenant, document={**document, "tool_contracts": CONTRACTS}, changed_by="t", reason="r")
    assert Tenant.objects.get(pk=acme.tenant.pk).breaker_state == "DEGRADED"

    search = intend(acme.worker, run, token, "search-1", "search", "web")
    operations.operation_authorize(worker=acme.worker, operation_id=search.pk, fencing_token=token)
    with pytest.raises(Denied) as refused:
        operations.operation_authorize(worker=acme.worker, operation_id=legacy.pk, fencing_token=token)

    search.refresh_from_db()
    assert search.phase == "AUTHORIZED"
    assert refused.value.code == "DENY_BUDGET"
    assert "its tool contract says NON_RETRYABLE" in refused.value.detail


def test_a_contract_that_asks_for_a_person_makes_the_operation_wait_for_approval(acme):
    with_contracts(acme.tenant)
    run, token = leased_run(acme.worker)
    op = intend(acme.worker, run, token, "refund-1", "payments", "refund")
    with pytest.raises(ApprovalRequired):
        operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    op.refresh_from_db()
    assert op.phase == "PENDING_APPROVAL"


def test_decisions_record_the_digest_of_the_policy_they_were_made_under(acme):
    with_contracts(acme.tenant)
    run, token = leased_run(acme.worker)
    op = intend(acme.worker, run, token, "s-1", "search", "web")
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)

    document = TenantPolicy.objects.get(tenant=acme.tenant, version=acme.tenant.policy_version).document
    for kind in ("OPERATION_AUTHORIZED", "OPERATION_DISPATCHED"):
        event = Event.objects.get(run=run, type=kind)
        assert event.fields["policy_version"] == acme.tenant.policy_version
        assert event.fields["policy_digest"] == policy_digest(document)
