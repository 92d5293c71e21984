import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from approvals.services.lookups import LookupPass, cases_look_up


class Command(BaseCommand):
    help = (
        "Look UNKNOWN effects up at their provider (the operation's reconciler): HAPPENED and DID_NOT_HAPPEN "
        "settle as RECONCILED by reconciler:<name>; PENDING or an unreachable provider are looked up again after "
        "a backoff; CANNOT_TELL, or too many attempts, go to people."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None, help="cases claimed per pass")
        parser.add_argument("--all", action="store_true", help="repeat passes until no case is due")

    def handle(self, *args: Any, batch_size: int | None = None, all: bool = False, **options: Any) -> None:
        total, passes, started = LookupPass(), 0, time.monotonic()
        while True:
            result = cases_look_up(batch_size=batch_size)
            passes += 1
            for name in ("claimed", "happened", "did_not_happen", "later", "to_people", "lost"):
                setattr(total, name, getattr(total, name) + getattr(result, name))
            if result.claimed:
                self.stderr.write(
                    f"  pass {passes}: {result.claimed} looked up, {result.happened + result.did_not_happen} settled, "
                    f"{result.to_people} to people, {result.later} later"
                )
            if not (all and result.claimed):
                break
        self.stdout.write(
            f"{total.claimed} UNKNOWN effect(s) looked up: {total.happened} happened, {total.did_not_happen} did not "
            f"happen, {total.later} to look up again, {total.to_people} to people, {total.lost} decided by someone "
            f"else first ({time.monotonic() - started:.1f} s)"
        )
