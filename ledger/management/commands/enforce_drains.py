from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from ledger.services.fleet.lifecycle import workers_drain_enforce, workers_stop_lapsed


class Command(BaseCommand):
    help = (
        "DRAINING workers that hold no lease become QUIESCED; those past their drain deadline "
        "have their leases revoked first (DISPATCHED effects become UNKNOWN with a case each); QUIESCED "
        "workers whose process heartbeat lapsed are STOPPED."
    )

    def handle(self, *args: object, **options: object) -> None:
        try:
            moved = workers_drain_enforce()
            stopped = workers_stop_lapsed(lapse_s=settings.FENCELINE["WORKER_HEARTBEAT_LAPSE_S"])
        except DatabaseError as exc:
            raise CommandError(f"enforcing drain deadlines failed: {type(exc).__name__}") from exc
        self.stdout.write(f"{moved} draining worker(s) are now QUIESCED; {stopped} quiesced worker(s) STOPPED")
