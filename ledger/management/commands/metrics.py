"""``manage.py metrics``: print what ``/metrics`` would answer (the database's metrics and,
with PROMETHEUS_MULTIPROC_DIR set, every process's counters) — for a quick look or a check
of a restored database without a Prometheus."""

from django.core.management.base import BaseCommand

from ledger.observability.metrics import scrape


class Command(BaseCommand):
    help = "Print the Prometheus metrics of this deployment (the text /metrics answers)."

    def handle(self, *args: object, **options: object) -> None:
        self.stdout.write(scrape().decode(), ending="")
