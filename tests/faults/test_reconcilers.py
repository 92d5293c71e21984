"""Provider lookups before people (approvals/services/lookups.py) against the real sandbox
provider over HTTP: each of the reconciler's answers settles as the issue says, a provider
that is down backs off and then hands the case to people, and what the reconciler asked and
saw is in the run's chain, never the answer's body."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import CaseStatus, ReconciliationCase
from approvals.selectors import case_queue
from approvals.services.cases import case_claim, case_resolve
from approvals.services.lookups import cases_look_up
from ledger.errors import StaleToken, WrongPhase
from ledger.models import Event, Operation
from ledger.services.fence import leases, outcomes
from ledger.services.fence.leases import leases_reap
from ledger.services.fence.retry import operation_retry_decision
from tests.factories import dispatched_operation, dispatched_payment, expire, leased_run, unknown_payment
from tests.helpers import assert_chain_intact, sandbox_charge

pytestmark = pytest.mark.django_db

RECONCILER = "sandbox-payments"


def due(case) -> None:
    """The test's clock: the case's next lookup is due now."""
    ReconciliationCase.objects.filter(pk=case.pk).update(next_lookup_at=timezone.now() - timedelta(seconds=1))


def lookups_of(run):
    return list(Event.objects.filter(run=run, type="CASE_LOOKED_UP").order_by("seq"))


def test_an_unknown_with_a_reconciler_waits_for_the_lookup_before_people_see_it(acme, sandbox):
    _run, op, case = unknown_payment(acme.worker, "pay-queue")

    assert op.reconciler == RECONCILER  # the provider's reconciler, chosen at intent
    assert case.status == CaseStatus.LOOKUP and case.reconciler == RECONCILER
    rows = case_queue(user=_superuser(), status="open").rows
    assert case.pk not in {row.pk for row in rows}  # not in the people's queue yet
    rows = case_queue(user=_superuser(), status="LOOKUP").rows
    assert case.pk in {row.pk for row in rows}


def test_a_lost_response_is_looked_up_by_key_and_reconciled_with_the_providers_id(acme, sandbox):
    run, _, op = dispatched_payment(acme.worker, "pay-lost-answer")
    assert sandbox_charge(sandbox, "pay-lost-answer", fault="drop") is None  # made, but the answer never came
    expire(run)
    leases_reap()  # the worker is gone: DISPATCHED -> UNKNOWN
    case = ReconciliationCase.objects.get(operation=op)
    assert case.status == CaseStatus.LOOKUP

    result = cases_look_up()

    assert (result.claimed, result.happened) == (1, 1)
    op.refresh_from_db()
    case.refresh_from_db()
    made = sandbox.ledger.charges["pay-lost-answer"]
    assert (op.phase, op.reconciliation, op.provider_request_id) == ("RECONCILED", "HAPPENED", made["id"])
    assert op.actual_cost_cents == 1200
    assert (case.status, case.resolution, case.resolved_by) == ("RESOLVED", "HAPPENED", f"reconciler:{RECONCILER}")
    [looked] = lookups_of(run)
    assert looked.actor == f"reconciler:{RECONCILER}"
    assert looked.fields["verdict"] == "HAPPENED"
    assert looked.fields["asked"] == "GET /v1/charges?idempotency_key=pay-lost-answer"
    assert looked.fields["status"] == 200 and looked.fields["answer_digest"].startswith("sha256:")
    assert "amount_cents" not in json.dumps(looked.fields)  # the answer's digest, never its body
    reconciled = Event.objects.get(run=run, type="OPERATION_RECONCILED")
    assert reconciled.seq == looked.seq + 1 and reconciled.fields["resolved_by"] == f"reconciler:{RECONCILER}"
    assert reconciled.fields["policy_digest"].startswith("sha256:")  # the policy it was decided under
    assert case.lookup_history[0]["verdict"] == "HAPPENED"
    assert_chain_intact(run.pk)


def test_a_charge_never_made_is_reconciled_as_not_happened_and_the_retry_follows_the_class(acme, sandbox):
    _, never, _ = unknown_payment(acme.worker, "pay-never", effect_class="NON_RETRYABLE")
    _, idempotent, _ = unknown_payment(acme.worker, "pay-never-idem", effect_class="IDEMPOTENT")

    result = cases_look_up()

    assert result.did_not_happen == 2
    for op in (never, idempotent):
        op.refresh_from_db()
        assert (op.phase, op.reconciliation) == ("RECONCILED", "DID_NOT_HAPPEN")
    assert operation_retry_decision(never)[0] == "APPROVAL"  # NON_RETRYABLE: a person decides
    assert operation_retry_decision(idempotent)[0] == "RETRY_SAME_KEY"


def test_pending_is_looked_up_again_after_a_backoff_and_then_settles(acme, sandbox):
    run, _op, case = unknown_payment(acme.worker, "pay-pending")
    sandbox_charge(sandbox, "pay-pending")
    sandbox.lookup_mode = "pending"

    assert cases_look_up().later == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.LOOKUP and case.lookup_attempts == 1
    assert case.next_lookup_at > timezone.now() + timedelta(seconds=3)  # the backoff, not at once
    assert cases_look_up().claimed == 0  # not due yet

    sandbox.lookup_mode = "normal"
    due(case)
    assert cases_look_up().happened == 1
    case.refresh_from_db()
    assert [entry["verdict"] for entry in case.lookup_history] == ["PENDING", "HAPPENED"]
    assert [e.fields["to"] for e in lookups_of(run)] == ["LOOKUP", "RESOLVED"]
    assert_chain_intact(run.pk)


def test_cannot_tell_hands_the_case_to_people_with_the_lookup_history(acme, sandbox):
    run, op, case = unknown_payment(acme.worker, "pay-cannot-tell")
    sandbox_charge(sandbox, "pay-cannot-tell")
    sandbox.lookup_mode = "cannot_tell"

    assert cases_look_up().to_people == 1

    case.refresh_from_db()
    op.refresh_from_db()
    assert case.status == CaseStatus.OPEN and op.phase == "UNKNOWN"  # never guessed away
    [entry] = case.lookup_history
    assert entry["verdict"] == "CANNOT_TELL" and entry["reconciler"] == RECONCILER
    # It says what it found and what a person does, not "none of the configured lists".
    assert entry["why"].startswith(
        "the provider found the record, but it has a 'status' that this reconciler does not map"
    )
    assert "happened: succeeded;" in entry["why"] and entry["why"].endswith("resolve the case by hand")
    rows = case_queue(user=_superuser(), status="open").rows
    assert case.pk in {row.pk for row in rows}
    assert lookups_of(run)[0].fields["to"] == "OPEN"


def test_a_provider_that_is_down_is_retried_with_backoff_then_handed_to_people(acme, sandbox):
    run, op, case = unknown_payment(acme.worker, "pay-down")
    sandbox.lookup_mode = "down"
    waits = []
    for _ in range(3):
        due(case)
        cases_look_up()
        case.refresh_from_db()
        if case.next_lookup_at:
            waits.append((case.next_lookup_at - timezone.now()).total_seconds())

    assert case.status == CaseStatus.OPEN and case.lookup_attempts == 3
    assert [entry["verdict"] for entry in case.lookup_history] == ["UNAVAILABLE"] * 3
    assert "3 lookups without an answer" in case.lookup_history[-1]["why"]
    assert len(waits) == 2 and waits[1] > waits[0] * 1.3  # exponential backoff (with jitter)
    op.refresh_from_db()
    assert op.phase == "UNKNOWN"
    assert_chain_intact(run.pk)


def test_a_lost_record_is_found_by_the_request_id_the_fenced_worker_reported(acme, sandbox):
    run, token, op = dispatched_payment(acme.worker, "pay-forgotten")
    made = sandbox_charge(sandbox, "pay-forgotten")
    sandbox.lose("pay-forgotten")  # the provider no longer finds the key
    expire(run)
    leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=30)  # takeover: UNKNOWN
    with pytest.raises(StaleToken):  # the fenced worker's late report is kept as unverified evidence
        outcomes.operation_report_outcome(
            worker=acme.worker,
            operation_id=op.pk,
            fencing_token=token,
            outcome="CONFIRMED",
            provider_request_id=made["id"],
        )

    assert cases_look_up().happened == 1

    op.refresh_from_db()
    assert op.provider_request_id == made["id"]
    [looked] = lookups_of(run)
    assert looked.fields["asked"] == f"GET /v1/charges/{made['id']}"


def test_a_lost_record_past_the_key_retention_is_not_taken_for_did_not_happen(acme, sandbox, settings):
    config = {**settings.FENCELINE["RECONCILERS"][RECONCILER], "key_retention_s": 1}
    settings.FENCELINE = {**settings.FENCELINE, "RECONCILERS": {RECONCILER: config}}
    _, op, case = unknown_payment(acme.worker, "pay-old-key")
    sandbox_charge(sandbox, "pay-old-key")
    sandbox.lose("pay-old-key")
    Operation.objects.filter(pk=op.pk).update(dispatched_at=timezone.now() - timedelta(seconds=10))

    assert cases_look_up().to_people == 1
    case.refresh_from_db()
    assert case.lookup_history[0]["verdict"] == "CANNOT_TELL"
    assert "forgets keys" in case.lookup_history[0]["why"]


def test_a_person_who_claims_the_case_first_stops_the_lookups(acme, sandbox):
    _, _op, case = unknown_payment(acme.worker, "pay-claimed")
    case_claim(case_id=case.pk, user=_superuser())

    assert cases_look_up().claimed == 0
    case.refresh_from_db()
    assert case.status == CaseStatus.CLAIMED and case.lookup_attempts == 0


def test_a_person_resolving_during_the_lookup_wins_and_the_answer_is_dropped(acme, sandbox, monkeypatch):
    run, _op, case = unknown_payment(acme.worker, "pay-race")
    sandbox_charge(sandbox, "pay-race")
    from approvals.services import lookups

    settle = lookups._settle

    def person_decides_meanwhile(claimed, answer):  # after the provider answered, before the settling
        case_resolve(case_id=claimed.pk, user=_superuser(), resolution="COMPENSATED", reason="refunded by hand")
        return settle(claimed, answer)

    monkeypatch.setattr(lookups, "_settle", person_decides_meanwhile)
    assert cases_look_up().lost == 1

    case.refresh_from_db()
    assert (case.resolution, case.resolved_by) == ("COMPENSATED", "root")
    assert case.lookup_history == [] and not lookups_of(run)  # the reconciler wrote nothing
    assert Event.objects.filter(run=run, type="OPERATION_RECONCILED").count() == 1
    with pytest.raises(WrongPhase):
        case_resolve(case_id=case.pk, user=_superuser(), resolution="HAPPENED", reason="x", provider_request_id="ch")


def test_an_operation_without_a_reconciler_goes_straight_to_people(acme, sandbox):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "e1")  # an email: no provider, no reconciler
    outcomes.operation_report_outcome(worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN")

    case = ReconciliationCase.objects.get(operation=op)
    assert (case.status, case.reconciler) == (CaseStatus.OPEN, "")


def test_an_answer_carrying_a_credential_is_not_kept_and_the_case_goes_to_people(acme, sandbox):
    from approvals.services import lookups
    from ledger.services.reconciliation.protocol import Lookup, Verdict

    canary = "AKIA" + "IOSFODNN7EXAMPLE"  # an AWS access key id: the secret boundary refuses it
    run, op, case = unknown_payment(acme.worker, "pay-hostile")
    case = ReconciliationCase.objects.select_related("operation").get(pk=case.pk)
    hostile = Lookup(Verdict.HAPPENED, asked="GET /v1/charges?idempotency_key=pay-hostile", provider_request_id=canary)

    assert lookups._settle(case, lookups._Answer(hostile)) == "to_people"

    case.refresh_from_db()
    op.refresh_from_db()
    assert case.status == CaseStatus.OPEN and op.phase == "UNKNOWN"
    assert case.lookup_history[-1]["why"] == "the provider's answer could not be kept as evidence"
    stored = json.dumps([e.fields for e in Event.objects.filter(run=run)]) + json.dumps(case.lookup_history)
    assert canary not in stored and canary not in op.provider_request_id


def _superuser():
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="root", defaults={"is_superuser": True})
    return user
