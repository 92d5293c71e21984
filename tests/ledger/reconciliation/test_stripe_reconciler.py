"""The Stripe adapter (ledger/services/reconciliation/providers/stripe.py) against a fake of
Stripe's Search API over HTTP: each PaymentIntent status gives its verdict with the provider's
evidence in the chain, results are paged, a 429 is waited out or handed back to the job, and the
API key is sent and kept nowhere."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import CaseStatus
from approvals.services.lookups import cases_look_up
from fenceline_client.provider_tags import stripe_metadata
from ledger.errors import StaleToken
from ledger.services.core.intent import Intent
from ledger.services.fence import leases, operations, outcomes
from tests.factories import expire, leased_run
from tests.fakes.base import Reply
from tests.helpers import Browser, assert_chain_intact
from tests.ledger.reconciliation.conftest import assert_nowhere, looked_up, unknown_effect

pytestmark = pytest.mark.django_db


def charge(acme, key: str, **kwargs):
    kwargs.setdefault("dispatched_ago_s", 120)  # past Stripe's search lag
    return unknown_effect(acme.worker, key, provider="stripe", tool="payments", resource="customer:cus_1", **kwargs)


def test_a_succeeded_payment_intent_is_happened_with_its_id_and_the_key_sent_as_bearer(acme, stripe, caplog):
    made = stripe.add("pay-1", "succeeded")
    stripe.add("pay-other", "succeeded")
    run, op, _case = charge(acme, "pay-1")

    assert cases_look_up().happened == 1

    op.refresh_from_db()
    assert (op.phase, op.reconciliation, op.provider_request_id) == ("RECONCILED", "HAPPENED", made["id"])
    [looked] = looked_up(run)
    assert looked["verdict"] == "HAPPENED"
    assert looked["asked"] == "GET /v1/payment_intents/search?query=metadata['fenceline_key']:'pay-1'&limit=100"
    assert looked["found"] == {
        "payment_intents": [{"id": made["id"], "status": "succeeded"}],
        "amount": 1200,
        "currency": "usd",
    }
    assert stripe.seen[0].headers["Authorization"] == f"Bearer {stripe.credential.removeprefix('Bearer ')}"
    assert_chain_intact(run.pk)
    assert "client_secret" not in str(looked)  # the answer's fields read, never its body
    assert_nowhere(stripe.credential.removeprefix("Bearer "), caplog.text)


@pytest.mark.parametrize(
    "status, verdict, outcome",
    [
        ("processing", "PENDING", "later"),
        ("requires_action", "PENDING", "later"),
        ("canceled", "DID_NOT_HAPPEN", "did_not_happen"),
        ("requires_payment_method", "DID_NOT_HAPPEN", "did_not_happen"),
        ("requires_capture", "HAPPENED", "happened"),
        ("some_new_status", "CANNOT_TELL", "to_people"),
    ],
)
def test_each_payment_intent_status_gives_its_verdict(acme, stripe, status, verdict, outcome):
    stripe.add(f"pay-{status}", status)
    run, _op, _case = charge(acme, f"pay-{status}")

    result = cases_look_up()

    assert getattr(result, outcome) == 1
    [looked] = looked_up(run)
    assert looked["verdict"] == verdict and looked["found"]["payment_intents"][0]["status"] == status


def test_no_payment_intent_with_the_key_did_not_happen_once_the_search_index_caught_up(acme, stripe):
    run, op, _ = charge(acme, "pay-never")

    assert cases_look_up().did_not_happen == 1
    op.refresh_from_db()
    assert op.reconciliation == "DID_NOT_HAPPEN"
    assert looked_up(run)[0]["why"] == "no PaymentIntent carries the key"


def test_a_new_intent_not_yet_in_the_search_index_is_looked_up_again_after_the_lag(acme, stripe):
    run, _op, case = charge(acme, "pay-fresh", dispatched_ago_s=0)

    assert cases_look_up().later == 1

    case.refresh_from_db()
    assert case.status == CaseStatus.LOOKUP
    assert case.next_lookup_at > timezone.now() + timedelta(seconds=40)  # Stripe's ~60 s, not the 5 s backoff
    assert looked_up(run)[0]["verdict"] == "UNAVAILABLE"


def test_two_payment_intents_that_went_through_go_to_a_person(acme, stripe):
    stripe.add("pay-twice", "succeeded")
    stripe.add("pay-twice", "succeeded")
    run, op, case = charge(acme, "pay-twice")

    assert cases_look_up().to_people == 1
    case.refresh_from_db()
    op.refresh_from_db()
    assert case.status == CaseStatus.OPEN and op.phase == "UNKNOWN"
    assert len(looked_up(run)[0]["found"]["payment_intents"]) == 2


def test_results_are_read_across_pages(acme, stripe):
    for _ in range(150):
        stripe.add("pay-paged", "canceled")
    made = stripe.add("pay-paged", "succeeded")
    _run, op, _ = charge(acme, "pay-paged")

    assert cases_look_up().happened == 1
    op.refresh_from_db()
    assert op.provider_request_id == made["id"]
    assert [s.query.get("page") for s in stripe.seen] == [None, ["page_100"]]


def test_a_429_is_waited_out_for_its_retry_after_then_answered(acme, stripe):
    stripe.add("pay-throttled", "succeeded")
    limited = Reply(429, {"error": {"type": "invalid_request_error", "code": "rate_limit"}}, {"Retry-After": "1"})
    stripe.throttle = [limited]
    _run, op, _ = charge(acme, "pay-throttled")

    assert cases_look_up().happened == 1
    assert len(stripe.seen) == 2  # asked again, after the wait
    op.refresh_from_db()
    assert op.reconciliation == "HAPPENED"


def test_a_provider_still_throttled_is_asked_again_no_sooner_than_it_said(acme, stripe):
    limited = Reply(429, {"error": {"type": "invalid_request_error", "code": "rate_limit"}}, {"Retry-After": "3600"})
    stripe.throttle = [limited] * 5
    run, op, case = charge(acme, "pay-busy")

    assert cases_look_up().later == 1

    case.refresh_from_db()
    op.refresh_from_db()
    assert len(stripe.seen) == 1  # an hour is past the wait a lookup may spend: no second ask
    assert case.status == CaseStatus.LOOKUP and op.phase == "UNKNOWN"
    assert case.next_lookup_at > timezone.now() + timedelta(seconds=3500)
    assert "throttled (status 429)" in looked_up(run)[0]["why"]


def test_a_wrong_api_key_is_cannot_tell_and_the_case_goes_to_people(acme, stripe):
    stripe.credential = "Bearer sk_test_someone_else"
    run, _op, case = charge(acme, "pay-refused")

    assert cases_look_up().to_people == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.OPEN
    [looked] = looked_up(run)
    assert looked["why"] == "Stripe answered status 401"
    assert looked["found"] == {"error_code": "invalid_request_error"}


def test_the_worker_tags_the_payment_intent_with_the_metadata_the_lookup_searches(acme, stripe):
    made = stripe.add("pay-tagged", "succeeded", metadata_key="other")
    made["metadata"] = stripe_metadata("pay-tagged")
    _run, _op, _ = charge(acme, "pay-tagged")

    assert cases_look_up().happened == 1


def test_a_person_sees_what_the_reconciler_found(acme, stripe, operator):
    first = stripe.add("pay-shown", "succeeded")
    second = stripe.add("pay-shown", "succeeded")
    _run, _op, case = charge(acme, "pay-shown")
    assert cases_look_up().to_people == 1

    page = Browser(operator).get("/cases/").content.decode()

    assert f"case-{case.pk}" in page
    assert "2 PaymentIntents carry the key and went through" in page
    assert "found: payment_intents" in page and first["id"] in page and second["id"] in page


def test_a_payment_intent_a_fenced_worker_reported_is_read_by_its_id_without_the_search_lag(acme, stripe):
    made = stripe.add("pay-reported", "succeeded")
    run, token, op = _dispatched(acme, "pay-reported")
    expire(run)
    leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=30)  # takeover: UNKNOWN
    with pytest.raises(StaleToken):  # the late report is kept on the case, unverified
        outcomes.operation_report_outcome(
            worker=acme.worker,
            operation_id=op.pk,
            fencing_token=token,
            outcome="CONFIRMED",
            provider_request_id=made["id"],
        )

    assert cases_look_up().happened == 1  # at once: no search, so no search lag
    assert [s.path for s in stripe.seen] == [f"/v1/payment_intents/{made['id']}"]
    op.refresh_from_db()
    assert op.provider_request_id == made["id"]


def test_a_reported_payment_intent_with_another_key_goes_to_a_person(acme, stripe):
    other = stripe.add("pay-someone-else", "succeeded")
    run, token, op = _dispatched(acme, "pay-mixed-up")
    expire(run)
    leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=30)
    with pytest.raises(StaleToken):
        outcomes.operation_report_outcome(
            worker=acme.worker,
            operation_id=op.pk,
            fencing_token=token,
            outcome="CONFIRMED",
            provider_request_id=other["id"],
        )

    assert cases_look_up().to_people == 1
    assert looked_up(run)[0]["why"] == f"PaymentIntent {other['id']} does not carry the operation's key"


def _dispatched(acme, key: str):
    run, token = leased_run(acme.worker)
    intent = Intent(
        tool="payments",
        action="create",
        resource="customer:cus_1",
        effect_class="NON_RETRYABLE",
        idempotency_key=key,
        provider="stripe",
    )
    op, _ = operations.operation_intend(worker=acme.worker, run_id=run.pk, fencing_token=token, intent=intent)
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    return run, token, op
