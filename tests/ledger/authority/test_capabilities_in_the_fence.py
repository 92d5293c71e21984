"""Authorize and dispatch read the run's capabilities for the operation's tool with the
fence's own locking statement (issue 16): no statement of their own, and the same answers."""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.errors import Denied
from ledger.models import CapabilityBudget, Operation
from ledger.services.authority.capabilities import capability_request
from ledger.services.core.intent import Intent
from ledger.services.fence import operations
from ledger.states import CapabilityStatus
from tests.factories import leased_run
from tests.helpers import assert_chain_intact

RESOURCE = "repo:acme/api:pull:481"


def _grant(worker, run, token, max_calls: int) -> CapabilityBudget:
    return capability_request(
        worker=worker,
        run_id=run.pk,
        fencing_token=token,
        tool="github",
        actions=["comment"],
        resources=[RESOURCE],
        max_calls=max_calls,
        ttl_s=600,
    ).capability


def _intend(worker, run, token, key: str) -> Operation:
    op, _ = operations.operation_intend(
        worker=worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool="github", action="comment", resource=RESOURCE, effect_class="IDEMPOTENT", idempotency_key=key
        ),
    )
    return op


def _capability_reads(captured) -> list[str]:
    """The statements that read capability budgets on their own (not the fence's lock)."""
    table = CapabilityBudget._meta.db_table
    return [
        q["sql"]
        for q in captured
        if table in q["sql"] and "FOR UPDATE OF" not in q["sql"] and "UPDATE" not in q["sql"][:10]
    ]


def test_authorize_and_dispatch_read_capabilities_with_the_lock_and_spend_them_in_order(acme):
    run, token = leased_run(acme.worker)
    first, second = _grant(acme.worker, run, token, 1), _grant(acme.worker, run, token, 1)
    denied = _grant(acme.worker, run, token, 5)
    CapabilityBudget.objects.filter(pk=denied.pk).update(status=CapabilityStatus.DENIED)  # a person said no
    ops = [_intend(acme.worker, run, token, f"c-{n}") for n in range(3)]
    with CaptureQueriesContext(connection) as captured:
        for op in ops[:2]:
            operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
            operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    assert _capability_reads(captured) == []
    spent = dict(CapabilityBudget.objects.filter(run=run).values_list("pk", "used_calls"))
    assert spent == {first.pk: 1, second.pk: 1, denied.pk: 0}  # never the DENIED one
    try:
        operations.operation_authorize(worker=acme.worker, operation_id=ops[2].pk, fencing_token=token)
    except Denied as refused:
        assert (refused.code, refused.extra.get("budget")) == ("DENY_BUDGET", "capability:calls")
    else:
        raise AssertionError("a third call was authorized with both capabilities spent")
    assert Operation.objects.get(pk=ops[2].pk).phase == "DENIED"
    assert_chain_intact(run.pk)
