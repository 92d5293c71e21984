"""Flow control at dispatch (ledger/services/authority/flow.py): the policy's concurrency
limits and rate limits per key kind, the refusal that leaves the operation AUTHORIZED, and
the places given back on every way out of DISPATCHED."""

import shlex
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from ledger.errors import InvalidInput, Throttled
from ledger.models import CostReservation, Event, FlowBucket, FlowSlot, Operation, Run
from ledger.policy import validate_policy
from ledger.services.authority.policy import policy_current
from ledger.services.core.intent import Intent
from ledger.services.fence import leases, operations, outcomes
from ledger.services.fence.ending import run_cancel, runs_enforce_limits
from ledger.services.fence.restore import fence_restore
from ledger.services.fleet.lifecycle import worker_quarantine
from tests.factories import confirm, expire, leased_run, set_policy

pytestmark = pytest.mark.django_db


def authorized(acme, run, token, key, *, tool="email", provider="", flow_key="", estimate=None):
    """An AUTHORIZED operation of ``tool`` in ``run``."""
    op, _ = operations.operation_intend(
        worker=acme.worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool=tool,
            action="send",
            resource="mailto:x@example.com",
            effect_class="IDEMPOTENT",
            idempotency_key=key,
            provider=provider,
            flow_key=flow_key,
            estimated_cost_cents=estimate,
        ),
    )
    return operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)


def dispatch(acme, op, token):
    return operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)


def throttled(acme, op, token) -> Throttled:
    """The THROTTLED refusal of dispatching ``op``, which must leave it AUTHORIZED with
    nothing recorded."""
    events = Event.objects.filter(run_id=op.run_id).count()
    with pytest.raises(Throttled) as refused:
        dispatch(acme, op, token)
    assert Operation.objects.get(pk=op.pk).phase == "AUTHORIZED"
    assert Event.objects.filter(run_id=op.run_id).count() == events
    assert not FlowSlot.objects.filter(operation=op).exists()
    assert refused.value.retry_after_s >= 1
    return refused.value


def held(tenant, key="tenant") -> int:
    """Places of ``key`` held now; each one's operation is DISPATCHED (the rule)."""
    slots = FlowSlot.objects.filter(tenant=tenant, key=key, operation__isnull=False)
    assert all(s.operation.phase == "DISPATCHED" for s in slots)
    return slots.count()


# --- the policy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"concurrency": {"tenant": 0}}, "policy.concurrency.tenant"),
        ({"concurrency": {"tenant": -1}}, "policy.concurrency.tenant"),
        ({"concurrency": {"tool:email": 1.5}}, "policy.concurrency.tool:email"),
        ({"concurrency": {"tool:email": True}}, "policy.concurrency.tool:email"),
        ({"concurrency": {"run:1": 2}}, "policy.concurrency.run:1"),
        ({"concurrency": {"tool:": 2}}, "policy.concurrency.tool:"),
        ({"concurrency": []}, "policy.concurrency"),
        ({"rate_limits": {"bogus": {"per_s": 1, "burst": 1}}}, "policy.rate_limits.bogus"),
        ({"rate_limits": {"tenant": {"per_s": 1}}}, "policy.rate_limits.tenant"),
        ({"rate_limits": {"tenant": {"per_s": 0, "burst": 1}}}, "policy.rate_limits.tenant.per_s"),
        ({"rate_limits": {"tenant": {"per_s": -2, "burst": 1}}}, "policy.rate_limits.tenant.per_s"),
        ({"rate_limits": {"tenant": {"per_s": "5", "burst": 1}}}, "policy.rate_limits.tenant.per_s"),
        ({"rate_limits": {"tenant": {"per_s": 1, "burst": 0}}}, "policy.rate_limits.tenant.burst"),
        ({"rate_limits": {"tenant": {"per_s": 1, "burst": 2.5}}}, "policy.rate_limits.tenant.burst"),
    ],
)
def test_a_bad_flow_limit_is_refused_naming_the_field(document, field):
    with pytest.raises(InvalidInput) as refused:
        validate_policy(document)
    assert refused.value.status == 422
    assert refused.value.extra["fields"][0]["field"] == field


def test_every_key_kind_is_accepted():
    limits = {"tenant": 3, "tool:email": 2, "provider:stripe": 1, "key:acme-42": 1, "key:*": 1}
    policy = validate_policy({"concurrency": limits, "rate_limits": {"tenant": {"per_s": 0.5, "burst": 4}}})
    assert policy["concurrency"] == limits


# --- concurrency, per key kind -----------------------------------------------------------


def test_a_tenant_concurrency_limit_refuses_past_n_and_the_same_dispatch_passes_once_a_place_is_back(acme):
    set_policy(acme.tenant, concurrency={"tenant": 2})
    run, token = leased_run(acme.worker)
    ops = [authorized(acme, run, token, f"k-{i}", estimate=100) for i in range(3)]
    dispatch(acme, ops[0], token)
    dispatch(acme, ops[1], token)

    refused = throttled(acme, ops[2], token)

    assert (refused.code, refused.status, refused.extra["key"], refused.extra["limit"]) == (
        "THROTTLED",
        409,
        "tenant",
        "concurrency",
    )
    assert not CostReservation.objects.filter(operation=ops[2]).exists()  # rolled back with it
    assert held(acme.tenant) == 2
    confirm(acme.worker, ops[0], token)
    assert held(acme.tenant) == 1
    assert dispatch(acme, ops[2], token).phase == "DISPATCHED"
    assert held(acme.tenant) == 2


def test_a_tool_limit_counts_only_that_tool(acme):
    set_policy(acme.tenant, concurrency={"tool:email": 1})
    run, token = leased_run(acme.worker)
    first, second = authorized(acme, run, token, "e-1"), authorized(acme, run, token, "e-2")
    other = authorized(acme, run, token, "s-1", tool="sms")
    dispatch(acme, first, token)
    assert throttled(acme, second, token).extra["key"] == "tool:email"
    assert dispatch(acme, other, token).phase == "DISPATCHED"
    assert held(acme.tenant, "tool:email") == 1


def test_a_named_flow_key_and_the_per_value_wildcard(acme):
    set_policy(acme.tenant, concurrency={"key:*": 1, "key:vip": 2})
    run, token = leased_run(acme.worker)
    a1, a2 = (
        authorized(acme, run, token, "a-1", flow_key="cust-a"),
        authorized(acme, run, token, "a-2", flow_key="cust-a"),
    )
    b1 = authorized(acme, run, token, "b-1", flow_key="cust-b")
    vips = [authorized(acme, run, token, f"v-{i}", flow_key="vip") for i in range(3)]
    plain = [authorized(acme, run, token, f"p-{i}") for i in range(3)]

    dispatch(acme, a1, token)
    assert throttled(acme, a2, token).extra["key"] == "key:cust-a"
    dispatch(acme, b1, token)  # another value: a limit of its own
    dispatch(acme, vips[0], token)
    dispatch(acme, vips[1], token)
    assert throttled(acme, vips[2], token).extra["key"] == "key:vip"
    for op in plain:  # no flow_key: no key:* limit
        dispatch(acme, op, token)
    assert Operation.objects.get(pk=a1.pk).flow_key == "cust-a"


# --- rate limits ---------------------------------------------------------------------------


def test_a_provider_rate_limit_gives_its_burst_then_refuses_with_the_wait_until_the_next_token(acme):
    set_policy(acme.tenant, rate_limits={"provider:mailer": {"per_s": 0.001, "burst": 3}})
    run, token = leased_run(acme.worker)
    ops = [authorized(acme, run, token, f"m-{i}", provider="mailer") for i in range(4)]
    unlimited = authorized(acme, run, token, "x-1", provider="other")
    for op in ops[:3]:
        dispatch(acme, op, token)

    refused = throttled(acme, ops[3], token)

    assert (refused.extra["key"], refused.extra["limit"]) == ("provider:mailer", "rate")
    # 3 shards of one token, each earning 0.001 / 3 per second: about 3,000 s to the next.
    assert 2000 < refused.retry_after_s <= 3001
    assert dispatch(acme, unlimited, token).phase == "DISPATCHED"
    buckets = FlowBucket.objects.filter(tenant=acme.tenant, key="provider:mailer")
    assert sorted(b.taken for b in buckets) == [1, 1, 1]  # the burst, spread over the shards


def test_a_token_taken_by_a_refused_dispatch_is_given_back(acme):
    """A dispatch refused by a later key (here its concurrency) rolls back its token."""
    set_policy(acme.tenant, concurrency={"tool:email": 1}, rate_limits={"tenant": {"per_s": 0.001, "burst": 2}})
    run, token = leased_run(acme.worker)
    first, second = authorized(acme, run, token, "r-1"), authorized(acme, run, token, "r-2")
    sms = authorized(acme, run, token, "r-3", tool="sms")
    dispatch(acme, first, token)
    assert throttled(acme, second, token).extra["key"] == "tool:email"
    assert dispatch(acme, sms, token).phase == "DISPATCHED"  # the second token was still there
    assert sum(FlowBucket.objects.filter(key="tenant").values_list("taken", flat=True)) == 2


def test_a_rate_limit_refills_by_the_database_clock(acme):
    set_policy(acme.tenant, rate_limits={"tenant": {"per_s": 1, "burst": 1}})
    run, token = leased_run(acme.worker)
    first, second = authorized(acme, run, token, "c-1"), authorized(acme, run, token, "c-2")
    dispatch(acme, first, token)
    throttled(acme, second, token)
    # The bucket's clock: its last refill moves two seconds into the past.
    FlowBucket.objects.filter(key="tenant").update(refilled_at=timezone.now() - timedelta(seconds=2))
    assert dispatch(acme, second, token).phase == "DISPATCHED"
    (bucket,) = FlowBucket.objects.filter(key="tenant")
    assert bucket.taken == 2 and 0 <= bucket.tokens < 1  # capped at the burst, one taken


# --- places come back on every way out of DISPATCHED --------------------------------------


def _outcome(kind):
    def leave(acme, run, token, op):
        extra = {"error_code": "E"} if kind == "FAILED" else {}
        outcomes.operation_report_outcome(
            worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome=kind, **extra
        )

    return leave


def _reaped(acme, run, token, op):
    expire(run)
    leases.leases_reap()


def _taken_over(acme, run, token, op):
    expire(run)
    leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=30)


def _revoked(acme, run, token, op):
    worker_quarantine(worker_id=acme.worker.pk, reason="test", name="olga")


def _grace_ended(acme, run, token, op):
    run_cancel(tenant=acme.tenant, run_id=run.pk, reason="stop", actor="ops")
    Run.objects.filter(pk=run.pk).update(cancel_grace_until=timezone.now() - timedelta(seconds=1))
    runs_enforce_limits()


def _restored(acme, run, token, op):
    fence_restore(by="olga")


EXITS = {
    "confirmed": _outcome("CONFIRMED"),
    "failed": _outcome("FAILED"),
    "unknown": _outcome("UNKNOWN"),
    "lease expired": _reaped,
    "takeover": _taken_over,
    "revoked": _revoked,
    "cancel grace": _grace_ended,
    "restore": _restored,
}


@pytest.mark.parametrize("exit_path", list(EXITS))
def test_the_place_comes_back_on_every_way_out_of_dispatched(acme, exit_path):
    set_policy(acme.tenant, concurrency={"tenant": 1, "tool:email": 1})
    run, token = leased_run(acme.worker)
    op = dispatch(acme, authorized(acme, run, token, "in-flight"), token)
    assert (held(acme.tenant), held(acme.tenant, "tool:email")) == (1, 1)

    EXITS[exit_path](acme, run, token, op)

    assert Operation.objects.get(pk=op.pk).phase != "DISPATCHED"
    assert (held(acme.tenant), held(acme.tenant, "tool:email")) == (0, 0)
    assert FlowSlot.objects.filter(tenant=acme.tenant).count() == 2  # the places stay, free


def test_the_database_refuses_a_place_kept_by_nobody_in_flight(acme):
    """The rule holds whatever moves the row: a phase change written by hand frees it too."""
    set_policy(acme.tenant, concurrency={"tenant": 1})
    run, token = leased_run(acme.worker)
    op = dispatch(acme, authorized(acme, run, token, "hand"), token)
    Operation.objects.filter(pk=op.pk).update(phase="CONFIRMED")
    assert held(acme.tenant) == 0


def test_the_operations_doc_example_applies_as_written(acme, tmp_path):
    """docs/operations.md, "Flow control at dispatch": its document, applied by its command."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "operations.md").read_text()
    section = text.split("## Flow control at dispatch", 1)[1].split("\n## ", 1)[0]
    (tmp_path / "flow.json").write_text(section.split("```json", 1)[1].split("```", 1)[0])
    command = section.split("`manage.py policy apply ", 1)[1].split("`", 1)[0]
    args = shlex.split(command.replace("flow.json", str(tmp_path / "flow.json")))
    call_command("policy", "apply", *args, stdout=StringIO())
    policy = policy_current(tenant=acme.tenant)[1]
    assert policy["concurrency"]["tool:email"] == 4
    assert policy["rate_limits"]["provider:stripe"] == {"per_s": 5, "burst": 10}
