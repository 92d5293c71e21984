"""The drain article's deploy test (issue 13): the old worker is paused at each of the five
boundaries, SIGTERM drains it (its handler calls POST /workers/me/drain), its deadline
passes while it is still paused, and a replacement worker takes the run over. Each test
makes the article's four checks, over HTTP through the Python client against PostgreSQL:

1. the old claim is fenced: the old worker's next write, once it wakes, is refused;
2. the replacement resumes from the durable checkpoint (the last one saved, nothing later);
3. an ambiguous effect (dispatched, outcome never stored) is UNKNOWN with a case, not
   retried; an effect that was never dispatched is not ambiguous and is not made UNKNOWN;
4. the same idempotency key is used on every retry: one operation, the provider asked at
   most once per key.
"""

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ReconciliationCase
from fenceline_client import client as fl
from ledger.models import Operation, RunResource, Worker
from ledger.services.fleet.lifecycle import workers_drain_enforce
from ledger.services.lifespan.reaper import resources_reap
from tests.factories import make_worker

CHARGE = {"tool": "payments", "action": "charge", "resource": "customer:881", "effect_class": "NON_RETRYABLE"}
SUBMIT = {"tool": "browser", "action": "submit_form", "resource": "portal:invoices", "effect_class": "NON_RETRYABLE"}


class Provider:
    """What the side effects reached: the calls per idempotency key."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def perform(self, key: str) -> fl.Done:
        self.calls[key] = self.calls.get(key, 0) + 1
        return fl.Done(provider_request_id=f"req-{key}")


class Drill:
    """One run, an old worker that holds it with step-1 checkpointed, and a replacement."""

    def __init__(self, live_server, acme) -> None:
        self.provider = Provider()
        self.old_identity = acme
        self.old = fl.Client(live_server.url, acme.token)
        self.new = fl.Client(live_server.url, make_worker("acme", "replacement").token)
        self.run_id = self.old.create_run(external_id="invoice-17")
        self.key = f"charge:{self.run_id}:step-2"
        self.lease = self.old.lease(self.run_id, ttl_s=30, owner_id="old-worker").__enter__()
        self.lease.checkpoint("step-1", {"invoices_done": 1})
        self.leases = [self.lease]

    def close(self) -> None:
        for lease in self.leases:  # no renewal thread outlives the test
            lease._stop.set()
            if lease._thread is not None:
                lease._thread.join(5)

    def pause(self) -> None:
        """The old process freezes here: its renewal thread stops with it."""
        self.lease._stop.set()

    def sigterm_then_deadline(self) -> None:
        """SIGTERM: the handler drains; the worker stays paused past the drain deadline."""
        self.old.drain(deadline_s=5, reason="rolling deploy")
        assert workers_drain_enforce(now=timezone.now() + timedelta(seconds=6)) == 1
        assert Worker.objects.get(pk=self.old_identity.worker.pk).status == "QUIESCED"

    def replace(self) -> fl.Lease:
        lease = self.new.lease(self.run_id, ttl_s=30, owner_id="replacement").__enter__()
        self.leases.append(lease)
        assert lease.token == 2
        return lease

    def operations(self) -> list[Operation]:
        return list(Operation.objects.filter(run_id=self.run_id))

    def check_resumed_from_checkpoint(self, lease: fl.Lease) -> None:
        assert (lease.checkpoint_position, lease.checkpoint_state) == ("step-1", {"invoices_done": 1})

    def check_old_claim_fenced(self) -> None:
        with pytest.raises((fl.StaleToken, fl.LeaseLost)):
            self.old.post(f"/runs/{self.run_id}/checkpoints", {"fencing_token": 1, "position": "step-2", "state": {}})

    def check_same_key(self, replacement: fl.Lease, intent: dict) -> dict:
        """The replacement retries step 2 under the same key: the same operation comes back."""
        result = replacement.operation(
            **intent, idempotency_key=self.key, perform=lambda: self.provider.perform(self.key)
        )
        (op,) = [op for op in self.operations() if op.idempotency_key == self.key]
        assert result["operation_id"] == str(op.pk)
        assert self.provider.calls.get(self.key, 0) == 1  # asked once, by whichever worker dispatched
        return result


@pytest.fixture
def drill(live_server, acme):
    drill = Drill(live_server, acme)
    yield drill
    drill.close()


def paused_in_perform(drill: Drill, intent: dict) -> tuple[threading.Thread, threading.Event, list]:
    """The old worker dispatches and then pauses inside ``perform`` (the provider was asked;
    the answer is not stored yet) until the returned event is set."""
    entered, wake, raised = threading.Event(), threading.Event(), []

    def perform() -> fl.Done:
        done = drill.provider.perform(drill.key)
        entered.set()
        wake.wait(30)
        return done

    def run() -> None:
        try:
            drill.lease.operation(**intent, idempotency_key=drill.key, perform=perform)
        except fl.FencelineError as refusal:
            raised.append(refusal)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert entered.wait(10)
    return thread, wake, raised


def test_paused_after_the_claim_before_the_checkpoint(drill):
    # step 2's work happens in memory; the process pauses before it checkpoints it
    drill.pause()
    drill.sigterm_then_deadline()
    replacement = drill.replace()
    drill.check_resumed_from_checkpoint(replacement)  # step-1: the unsaved step 2 is redone
    drill.check_old_claim_fenced()
    assert not ReconciliationCase.objects.filter(run_id=drill.run_id).exists()  # nothing ambiguous
    result = drill.check_same_key(replacement, CHARGE)
    assert result["phase"] == "CONFIRMED"


def test_paused_after_the_intent_before_the_dispatch(drill):
    planned = drill.lease.post(f"/runs/{drill.run_id}/operations", {**CHARGE, "idempotency_key": drill.key})
    drill.pause()
    drill.sigterm_then_deadline()
    # Waking during the drain, it may not dispatch: the operation stays for the replacement.
    with pytest.raises((fl.WorkerDraining, fl.StaleToken, fl.LeaseLost, fl.WorkerNotAccepting)):
        drill.old.post(f"/operations/{planned['operation_id']}/dispatch", {"fencing_token": 1})
    replacement = drill.replace()
    drill.check_resumed_from_checkpoint(replacement)
    drill.check_old_claim_fenced()
    assert Operation.objects.get(pk=planned["operation_id"]).phase == "PLANNED"  # never dispatched: not UNKNOWN
    result = drill.check_same_key(replacement, CHARGE)
    assert (result["operation_id"], result["phase"]) == (planned["operation_id"], "CONFIRMED")


def test_paused_after_the_dispatch_before_the_response_is_stored(drill):
    thread, wake, raised = paused_in_perform(drill, CHARGE)
    drill.pause()
    drill.sigterm_then_deadline()
    (op,) = drill.operations()
    assert op.phase == "UNKNOWN"  # the deadline made the ambiguous effect UNKNOWN ...
    assert ReconciliationCase.objects.get(operation=op).status == "OPEN"  # ... with a case
    replacement = drill.replace()
    drill.check_resumed_from_checkpoint(replacement)
    result = drill.check_same_key(replacement, CHARGE)
    assert result["phase"] == "UNKNOWN"  # not retried blindly: the provider was asked once
    wake.set()  # the old process wakes up with the provider's answer
    thread.join(10)
    assert raised and isinstance(raised[0], (fl.StaleToken, fl.LeaseLost))  # its late outcome is fenced
    drill.check_old_claim_fenced()
    assert Operation.objects.get(pk=op.pk).phase == "UNKNOWN"


def test_paused_after_a_browser_session_mutation_before_its_acknowledgement(drill):
    session = drill.lease.attach("browser_session", "sandbox", "profile-17")
    thread, wake, raised = paused_in_perform(drill, SUBMIT)
    drill.pause()
    drill.sigterm_then_deadline()
    (op,) = drill.operations()
    assert op.phase == "UNKNOWN" and ReconciliationCase.objects.filter(operation=op).exists()
    # the session the mutation ran in is closed by the reaper, not left to the new worker
    assert RunResource.objects.get(pk=session).state == "RELEASE_REQUESTED"
    resources_reap()
    assert RunResource.objects.get(pk=session).state == "RELEASED"
    replacement = drill.replace()
    drill.check_resumed_from_checkpoint(replacement)
    result = drill.check_same_key(replacement, SUBMIT)
    assert result["phase"] == "UNKNOWN"  # the form is not submitted a second time
    wake.set()
    thread.join(10)
    assert raised and isinstance(raised[0], (fl.StaleToken, fl.LeaseLost))
    drill.check_old_claim_fenced()


def test_paused_after_the_drain_deadline_before_the_exit(drill):
    thread, wake, raised = paused_in_perform(drill, CHARGE)
    drill.sigterm_then_deadline()  # the process is alive but late: the deadline revoked its lease
    (op,) = drill.operations()
    assert op.phase == "UNKNOWN"
    wake.set()  # late writes before it exits: the outcome, a checkpoint, a renewal
    thread.join(10)
    assert raised and isinstance(raised[0], (fl.StaleToken, fl.LeaseLost))
    drill.check_old_claim_fenced()
    with pytest.raises(fl.LeaseLost):
        drill.old.post(f"/runs/{drill.run_id}/lease/renew", {"owner_id": "old-worker", "fencing_token": 1, "ttl_s": 30})
    assert drill.old.exit()["status"] == "STOPPED"  # then it exits
    replacement = drill.replace()
    drill.check_resumed_from_checkpoint(replacement)
    result = drill.check_same_key(replacement, CHARGE)
    assert result["phase"] == "UNKNOWN"
    assert Operation.objects.get(pk=op.pk).phase == "UNKNOWN"  # the late answer changed nothing
