from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from ledger.services.fleet.lifecycle import workers_drain_enforce


class Command(BaseCommand):
    help = (
        "DRAINING workers that hold no lease become QUIESCED; those past their drain deadline "
        "have their leases revoked first (DISPATCHED effects become UNKNOWN with a case each)."
    )

    def handle(self, *args, **options):
        try:
            moved = workers_drain_enforce()
        except DatabaseError as exc:
            raise CommandError(f"enforcing drain deadlines failed: {type(exc).__name__}") from exc
        self.stdout.write(f"{moved} draining worker(s) are now QUIESCED")
