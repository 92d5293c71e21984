from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from approvals.services.case_timers import TimerPass, cases_enforce_timers


class Command(BaseCommand):
    help = (
        "Expire claims past their tenant's acknowledge time (policy case_timers.ack_s) and escalate cases "
        "unclaimed past its escalation time (case_timers.escalate_s). Safe to run again or beside the job."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=500)

    def handle(self, *args: Any, batch_size: int, **options: Any) -> None:
        def progress(so_far: TimerPass) -> None:
            self.stderr.write(f"  {so_far.claims_expired} claim(s) expired, {so_far.escalated} escalated so far")

        result = cases_enforce_timers(batch_size=batch_size, progress=progress)
        self.stdout.write(f"expired {result.claims_expired} claim(s), escalated {result.escalated} case(s)")
