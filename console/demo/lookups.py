"""Provider lookups before people: two charges whose answers were lost. The sandbox provider
has the first one (the reconciler settles it: RECONCILED by reconciler:sandbox-payments, with
the charge id); of the second it cannot tell, so it waits in the queue for a person, with the
lookup on the case."""

import contextlib
from collections.abc import Callable

import requests
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from approvals.models import ReconciliationCase
from approvals.services.lookups import cases_look_up
from console.demo.acting import Acting
from console.simulation.provider import SandboxProvider
from ledger.states import EffectClass, Outcome

LOST, UNCLEAR = "demo:charge:lost-answer", "demo:charge:cannot-tell"


def seed(acting: Acting, sandbox: SandboxProvider, say: Callable[[str], None]) -> None:
    run, token = acting.leased("demo-lookups")
    for key in (LOST, UNCLEAR):
        op = acting.dispatch(
            run,
            token,
            key,
            tool="payments",
            action="charge",
            resource="customer:901",
            effect=EffectClass.NON_RETRYABLE,
            provider="sandbox-payments",
        )
        with contextlib.suppress(requests.ConnectionError):  # the answer is lost on the way back
            requests.post(
                sandbox.url + "/v1/charges",
                headers={"Idempotency-Key": key, "Sandbox-Fault": "drop"},
                json={"amount_cents": 1900, "customer": "c:901"},
                timeout=5,
            )
        acting.outcome(op, token, Outcome.UNKNOWN, error_code="READ_TIMEOUT")
    sandbox.cannot_tell_keys.add(UNCLEAR)
    with override_settings(FENCELINE={**settings.FENCELINE, "RECONCILE_AFTER_S": 0}):
        ReconciliationCase.objects.filter(run=run).update(next_lookup_at=timezone.now())
        result = cases_look_up()
    say(
        f"provider lookups: {result.happened} settled by reconciler:sandbox-payments, "
        f"{result.to_people} handed to people"
    )
