"""The reconciliation queue in an incident: a group of similar cases (five SMS sends whose
provider timed out, one group to act on at once) and a case nobody claimed that the case
timers escalated (its effect became UNKNOWN three hours ago by the demo's clock)."""

from datetime import timedelta

from django.utils import timezone

from approvals.models import ReconciliationCase
from approvals.services.case_timers import cases_enforce_timers
from console.demo.acting import Acting
from ledger.states import EffectClass, Outcome

SIMILAR = 5


def seed(acting: Acting) -> None:
    similar(acting)
    escalated_by_the_timer(acting)


def similar(acting: Acting) -> None:
    """Five texts to on-call phones, each answered by a read timeout: five alike cases."""
    run, token = acting.leased("demo-sms-outage")
    for n in range(SIMILAR):
        op = acting.dispatch(
            run,
            token,
            f"demo:sms:{n}",
            tool="sms",
            action="send",
            resource=f"tel:+1555010{n}",
            effect=EffectClass.NON_RETRYABLE,
        )
        acting.outcome(op, token, Outcome.UNKNOWN, error_code="READ_TIMEOUT")


def escalated_by_the_timer(acting: Acting) -> None:
    """A DNS change whose answer timed out three hours ago and nobody claimed: the case
    timers' job (policy case_timers.escalate_s, 2 h) escalates it, as it would have."""
    run, token = acting.leased("demo-unclaimed")
    op = acting.dispatch(run, token, "demo:dns:1", tool="dns", action="update", resource="zone:example.com")
    acting.outcome(op, token, Outcome.UNKNOWN, error_code="READ_TIMEOUT")
    ReconciliationCase.objects.filter(operation=op).update(
        opened_at=timezone.now() - timedelta(hours=3)
    )  # the demo's clock
    cases_enforce_timers()
