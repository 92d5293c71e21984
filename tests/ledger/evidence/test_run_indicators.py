"""The four indicators, shown separately, each with a reason when it is not green, read
without rescanning the chain."""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger import selectors
from ledger.models import Run
from ledger.services.evidence.verification import run_verify
from ledger.services.fence import outcomes, runs
from tests.factories import dispatched_operation, leased_run


def indicators(run):
    return selectors.run_indicators(Run.objects.get(pk=run.pk))


def test_a_fresh_run_is_complete_unsealed_ok_and_certain(acme):
    run, _ = leased_run(acme.worker)
    ind = indicators(run)
    assert {k: v["value"] for k, v in ind.items()} == {
        "completeness": "COMPLETE",
        "integrity": "UNSEALED",
        "authorization": "OK",
        "certainty": "CERTAIN",
    }
    assert "no checkpoint yet" in ind["integrity"]["reason"]
    assert ind["completeness"]["reason"] is None and ind["certainty"]["reason"] is None


def test_unknown_effects_make_the_run_uncertain_with_counts(acme):
    run, token = leased_run(acme.worker)
    confirmed = dispatched_operation(acme.worker, run, token, "k-1")
    outcomes.operation_report_outcome(
        worker=acme.worker, operation_id=confirmed.pk, fencing_token=token, outcome="CONFIRMED"
    )
    unknown = dispatched_operation(acme.worker, run, token, "k-2")
    outcomes.operation_report_outcome(
        worker=acme.worker, operation_id=unknown.pk, fencing_token=token, outcome="UNKNOWN"
    )
    dispatched_operation(acme.worker, run, token, "k-3")
    ind = indicators(run)["certainty"]
    assert ind["value"] == "UNCERTAIN"
    assert ind["counts"] == {
        "confirmed": 1,
        "unknown": 1,
        "reconciled": 0,
        "failed": 0,
        "in_flight": 1,
        "intended_only": 0,
    }
    assert ind["reason"] == "1 UNKNOWN, 1 dispatched without an outcome yet"


def test_completion_with_an_effect_in_flight_is_incomplete_and_then_verified(acme):
    run, token = leased_run(acme.worker)
    dispatched_operation(acme.worker, run, token, "k-1")
    runs.run_complete(worker=acme.worker, run_id=run.pk, fencing_token=token)
    run_verify(run_id=run.pk)  # what the completion queues
    ind = indicators(run)
    assert ind["completeness"]["value"] == "INCOMPLETE"
    assert ind["completeness"]["reason"] == "1 dispatched effect(s) had no terminal outcome at completion"
    assert ind["integrity"]["value"] == "VERIFIED"
    assert ind["integrity"]["checkpoint_seq"] == Run.objects.get(pk=run.pk).last_seq
    assert ind["certainty"]["value"] == "UNCERTAIN"  # the in-flight effect became UNKNOWN


def test_new_events_after_a_checkpoint_make_integrity_unsealed_again(acme, settings):
    settings.FENCELINE = {**settings.FENCELINE, "CHECKPOINT_EVERY": 3}
    run, token = leased_run(acme.worker)  # 2 events
    dispatched_operation(acme.worker, run, token, "k-1")  # +3 = 5
    run_verify(run_id=run.pk)  # seals seq 3
    ind = indicators(run)["integrity"]
    assert (ind["value"], ind["checkpoint_seq"]) == ("UNSEALED", 3)
    assert ind["reason"] == "head seq 5 is beyond the last checkpoint (3)"


def test_reading_the_indicators_costs_no_query(acme):
    run, token = leased_run(acme.worker)
    for n in range(5):
        dispatched_operation(acme.worker, run, token, f"k-{n}")
    loaded = Run.objects.get(pk=run.pk)
    with CaptureQueriesContext(connection) as queries:
        selectors.run_indicators(loaded)
    assert len(queries) == 0
