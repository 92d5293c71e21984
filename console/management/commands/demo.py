"""`python manage.py demo`: migrate, seed a demo tenant through the real services
(``console/demo/``), then serve the console and API with the background jobs (a Celery worker
with beat) and the sandbox payments provider (``console/simulation/provider.py``)."""

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from console.demo.seed import TENANT, WORKER, seed
from console.simulation.provider import SandboxProvider
from ledger.services.reconciliation.http import HttpReconciler
from ledger.services.reconciliation.registry import register


class Command(BaseCommand):
    help = "Seed a demo tenant and worker, then serve the console and API with background jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "addrport", nargs="?", default="127.0.0.1:8000", help="where to serve (default 127.0.0.1:8000)"
        )
        parser.add_argument("--no-serve", action="store_true", help="seed and print the token, then exit")
        parser.add_argument("--no-jobs", action="store_true", help="do not start the Celery worker and beat")

    def handle(self, *args: Any, addrport: str, no_serve: bool, no_jobs: bool, **options: Any) -> None:
        self.jobs_log = settings.STATE_DIR / "demo-jobs.log"
        self.stdout.write("migrating the database ...")
        call_command("migrate", interactive=False, verbosity=0)
        self.sandbox = self.start_sandbox()
        token = seed(self.sandbox, self.stdout.write)
        host = addrport if ":" in addrport else f"127.0.0.1:{addrport}"
        ready = self.ready_text(host, token)
        if no_serve:
            self.stdout.write(ready)
            return
        jobs = None if no_jobs else self.start_jobs()
        # The token and the curl line come last, once the server answers: Celery's and the
        # server's start-up lines would otherwise scroll them away.
        threading.Thread(target=self.announce_when_up, args=(host, ready), daemon=True).start()
        # A `kill` or a closed terminal stops the demo as Ctrl-C does: the jobs with it, and the
        # embedded database after the last of them.
        for stop in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(stop, _interrupt)
        try:
            call_command("runserver", addrport, use_reloader=False)
        finally:
            if jobs is not None:
                jobs.send_signal(signal.SIGTERM)
                try:
                    jobs.wait(10)
                except subprocess.TimeoutExpired:
                    jobs.kill()

    def ready_text(self, host: str, token: str) -> str:
        return "\n".join(
            [
                "",
                f"Fenceline demo at http://{host}/ (sign in as operator / operator-demo; more users above).",
                f"Tenant {TENANT!r}, worker {WORKER!r}. Its bearer token (a new one each start):",
                f"  {token}",
                "Try it:",
                f"  curl -s -X POST http://{host}/api/v1/runs -H 'Authorization: Bearer {token}' "
                "-H 'Content-Type: application/json' -d '{\"schema_version\": 1}'",
                f"API docs: http://{host}/api/v1/docs · background jobs log: {self.jobs_log}",
                "Another address: make demo DEMO_ADDR=127.0.0.1:8010 (or python manage.py demo 8010). Ctrl-C stops.",
                "",
            ]
        )

    def announce_when_up(self, host: str, ready: str) -> None:
        for _ in range(300):
            try:
                if requests.get(f"http://{host}/healthz", timeout=1).ok:
                    self.stdout.write(ready)
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)

    def start_sandbox(self) -> SandboxProvider:
        """The sandbox payments provider at the URL the built-in reconciler looks charges up
        at (FENCELINE_SANDBOX_PROVIDER_URL, 127.0.0.1:8766), for as long as the demo runs;
        on another free port, with the reconciler registered there, when that one is taken."""
        configured = settings.FENCELINE["RECONCILERS"]["sandbox-payments"]
        port = urlsplit(configured["base_url"]).port or 8766
        try:
            sandbox = SandboxProvider(port=port).start()
        except OSError:
            sandbox = SandboxProvider().start()
            config = {k: v for k, v in configured.items() if k != "provider"}
            register(
                "sandbox-payments",
                HttpReconciler("sandbox-payments", {**config, "base_url": sandbox.url}),
                provider="sandbox-payments",
            )
        # Its webhook sink is on loopback, which a webhook may reach only when named: the demo
        # names it, as an operator names an internal receiver (FENCELINE_WEBHOOK_ALLOWED_HOSTS).
        allowed = settings.FENCELINE["WEBHOOK_ALLOWED_HOSTS"] | {urlsplit(sandbox.url).netloc}
        settings.FENCELINE["WEBHOOK_ALLOWED_HOSTS"] = allowed
        self.stdout.write(
            f"sandbox payments provider at {sandbox.url} (reconciler sandbox-payments looks charges up there)"
        )
        return sandbox

    def start_jobs(self) -> subprocess.Popen[bytes]:
        schedule = settings.STATE_DIR / "celerybeat-schedule"
        self.stdout.write(
            f"starting background jobs (Celery worker with beat, broker {settings.CELERY_BROKER_URL}); "
            f"their output goes to {self.jobs_log}"
        )
        log = self.jobs_log.open("ab")
        return subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "console",
                "worker",
                "--beat",
                "--pool=solo",
                "--loglevel=WARNING",
                "-s",
                str(schedule),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "FENCELINE_WEBHOOK_ALLOWED_HOSTS": ",".join(sorted(settings.FENCELINE["WEBHOOK_ALLOWED_HOSTS"])),
            },
        )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
