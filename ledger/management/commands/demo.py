"""`python manage.py demo`: migrate, seed a demo tenant through the real services, then
serve the console and API with the background jobs (a Celery worker with beat)."""

import signal
import subprocess
import sys
from datetime import timedelta

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.utils import timezone

from ledger.models import RunLease, Worker
from ledger.services import leases, operations, runs
from ledger.services.errors import StaleToken
from ledger.services.operations import Intent
from ledger.services.workers import tenant_ensure, worker_create, worker_rotate_token

TENANT = "demo"
WORKER = "demo-worker"


class Command(BaseCommand):
    help = "Seed a demo tenant and worker, then serve the console and API with background jobs."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000", help="where to serve (default 127.0.0.1:8000)")
        parser.add_argument("--no-serve", action="store_true", help="seed and print the token, then exit")
        parser.add_argument("--no-jobs", action="store_true", help="do not start the Celery worker and beat")

    def handle(self, *args, addrport, no_serve, no_jobs, **options):
        self.stdout.write("migrating the database ...")
        call_command("migrate", interactive=False, verbosity=0)
        token = self.seed()
        host = addrport if ":" in addrport else f"127.0.0.1:{addrport}"
        self.stdout.write(
            "\n".join(
                [
                    "",
                    f"Tenant {TENANT!r}, worker {WORKER!r}. Its bearer token (a new one each start):",
                    f"  {token}",
                    "",
                    "Try it:",
                    f"  curl -s -X POST http://{host}/api/v1/runs -H 'Authorization: Bearer {token}' "
                    "-H 'Content-Type: application/json' -d '{\"schema_version\": 1}'",
                    f"API docs: http://{host}/api/v1/docs",
                    "",
                ]
            )
        )
        if no_serve:
            return
        jobs = None if no_jobs else self.start_jobs()
        try:
            call_command("runserver", addrport, use_reloader=False)
        finally:
            if jobs is not None:
                jobs.send_signal(signal.SIGTERM)
                try:
                    jobs.wait(10)
                except subprocess.TimeoutExpired:
                    jobs.kill()

    def seed(self) -> str:
        tenant, _ = tenant_ensure(slug=TENANT, name="Demo tenant")
        existing = Worker.objects.filter(tenant=tenant, name=WORKER).first()
        if existing is not None:
            return worker_rotate_token(worker=existing)
        worker, token = worker_create(tenant=tenant, name=WORKER)
        self.stdout.write("seeding demo runs through the services ...")
        self.seed_runs(worker)
        return token

    def seed_runs(self, worker: Worker) -> None:
        def intent(key: str, effect: str = "IDEMPOTENT") -> Intent:
            return Intent(tool="github", action="create_issue", resource="repo:acme/web", effect_class=effect, idempotency_key=key)

        def dispatch(run, token, key, effect="IDEMPOTENT"):
            op, _ = operations.operation_intend(worker=worker, run_id=run.pk, fencing_token=token, intent=intent(key, effect))
            operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
            return operations.operation_dispatch(worker=worker, operation_id=op.pk, fencing_token=token)

        # A run whose effect was confirmed.
        run, _ = runs.run_create(worker=worker, schema_version=1, external_id="demo-confirmed")
        token = leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="agent-a", ttl_s=3600).fencing_token
        op = dispatch(run, token, "demo:issue:1")
        operations.operation_report_outcome(
            worker=worker, operation_id=op.pk, fencing_token=token, outcome="CONFIRMED", provider_request_id="gh-1001"
        )

        # A run taken over after its owner stalled: the stale owner is fenced, its in-flight
        # effect is UNKNOWN with a case and its late report kept as unverified evidence.
        run, _ = runs.run_create(worker=worker, schema_version=1, external_id="demo-takeover")
        token = leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="agent-stalled", ttl_s=60).fencing_token
        op = dispatch(run, token, "demo:email:7", effect="NON_RETRYABLE")
        RunLease.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
        leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="agent-rescue", ttl_s=3600)
        try:
            operations.operation_report_outcome(
                worker=worker, operation_id=op.pk, fencing_token=token, outcome="CONFIRMED", provider_request_id="msg-77"
            )
        except StaleToken:
            pass  # expected: that is the point of the demo

    def start_jobs(self) -> subprocess.Popen:
        schedule = settings.STATE_DIR / "celerybeat-schedule"
        self.stdout.write(f"starting background jobs (Celery worker with beat, broker {settings.CELERY_BROKER_URL})")
        return subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "console", "worker", "--beat",
                "--pool=solo", "--loglevel=WARNING", "-s", str(schedule),
            ]
        )
