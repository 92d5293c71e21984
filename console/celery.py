"""The Celery application. Tasks live in each app's tasks.py; the schedule is in settings."""

import os

from celery import Celery
from celery.signals import worker_process_init

from ledger.observability.tracing import setup_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("fenceline")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect(weak=False)  # type: ignore[untyped-decorator]
def _tracing(**kwargs: object) -> None:
    """Spans for jobs when OTEL_EXPORTER_OTLP_ENDPOINT is set, per worker process (after the fork)."""
    setup_tracing()
