from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.services.notifications import notifications_scan
from ledger.services.notifications.delivery import deliveries_due, deliveries_send

MAX_ROUNDS = 1000  # --all stops here even if something keeps becoming due


class Command(BaseCommand):
    help = (
        "Webhook notifications once: current conditions become deliveries (at most once per condition "
        "and endpoint), then due deliveries are sent, signed, with retries and backoff. --all sends "
        "until nothing is due now (retries wait for their backoff: run it again later)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--all", action="store_true", help="send batches until nothing is due")
        parser.add_argument("--batch-size", type=int, default=None, help="deliveries claimed per batch")

    def handle(self, *args: Any, all: bool = False, batch_size: int | None = None, **options: Any) -> None:
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        scan = notifications_scan()
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(scan.by_kind.items())) or "none"
        self.stdout.write(
            f"{scan.endpoints} enabled endpoints; {scan.created} new deliveries ({kinds}); "
            f"{scan.refused} refused by the secret boundary"
        )
        totals = {"claimed": 0, "delivered": 0, "retrying": 0, "gave_up": 0}
        for round_ in range(1, MAX_ROUNDS + 1):
            sent = deliveries_send(batch_size=batch_size)
            for name in totals:
                totals[name] += getattr(sent, name)
            if all and sent.claimed:
                self.stderr.write(f"  batch {round_}: {sent.delivered} delivered, {sent.retrying} to retry")
            if not all or not sent.claimed or not deliveries_due():
                break
        self.stdout.write(
            f"{totals['claimed']} deliveries sent: {totals['delivered']} delivered, "
            f"{totals['retrying']} to retry later, {totals['gave_up']} given up"
        )
