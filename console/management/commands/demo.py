"""`python manage.py demo`: migrate, seed a demo tenant through the real services
(``console/demo/``), then serve the console and API with the background jobs (a Celery worker
with beat) and the sandbox payments provider (``console/simulation/provider.py``).

The terminal stays readable: each request's log lines go to ``demo-requests.log`` in the state
directory, the jobs' output to ``demo-jobs.log``, and the URL and the token are printed last,
once the server answers. Ctrl-C, ``kill -TERM`` or a closed terminal stops it all: the jobs run
in their own process group, which is stopped whole (Celery's beat is a process of its own).
"""

import contextlib
import logging.config
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

# Loggers that write a line per request (ours, and runserver's own access line) or per sign-in.
REQUEST_LOGGERS = ("fenceline.request", "django.server", "axes")


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
        self.requests_log = settings.STATE_DIR / "demo-requests.log"
        self.stdout.write("migrating the database ...")
        call_command("migrate", interactive=False, verbosity=0)
        self.sandbox = self.start_sandbox()
        token = seed(self.sandbox, self.stdout.write)
        host = addrport if ":" in addrport else f"127.0.0.1:{addrport}"
        ready = self.ready_text(host, token)
        if no_serve:
            self.stdout.write(ready)
            return
        # A `kill` or a closed terminal stops the demo as Ctrl-C does, from before the jobs start:
        # the jobs with it, and the embedded database after the last of them.
        for stop in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(stop, _interrupt)
        jobs = None
        try:
            jobs = None if no_jobs else self.start_jobs()
            self.quiet_requests()
            # The token and the curl line come last, once the server answers: Celery's and the
            # server's start-up lines would otherwise scroll them away.
            threading.Thread(target=self.announce_when_up, args=(host, ready), daemon=True).start()
            call_command("runserver", addrport, use_reloader=False)
        finally:
            if jobs is not None:
                stop_group(jobs)

    def quiet_requests(self) -> None:
        """Each request's log lines (and each sign-in's) to ``demo-requests.log``, not the
        terminal. Written into ``settings.LOGGING``: loading the WSGI application configures
        logging again from it."""
        config: dict[str, Any] = settings.LOGGING
        config["handlers"]["demo_requests"] = {
            "class": "logging.FileHandler",
            "filename": str(self.requests_log),
            "formatter": "json",
            "filters": ["withhold_exception_messages", "withhold_credentials"],
        }
        for name in REQUEST_LOGGERS:
            config["loggers"][name] = {"handlers": ["demo_requests"], "level": "INFO", "propagate": False}
        logging.config.dictConfig(config)

    def ready_text(self, host: str, token: str) -> str:
        """What to do next, with the URL and the token last (where a terminal leaves them in sight)."""
        return "\n".join(
            [
                "",
                f"API docs: http://{host}/api/v1/docs · logs: requests {self.requests_log}, jobs {self.jobs_log}",
                "Another address: make demo DEMO_ADDR=127.0.0.1:8010 (or python manage.py demo 8010).",
                "Ctrl-C (or kill -TERM) stops the server, the jobs and the database.",
                "Try it:",
                f"  curl -s -X POST http://{host}/api/v1/runs -H 'Authorization: Bearer {token}' "
                "-H 'Content-Type: application/json' -d '{}'",
                f"Tenant {TENANT!r}, worker {WORKER!r}. Its bearer token (a new one each start):",
                f"  {token}",
                f"Fenceline demo at http://{host}/ (sign in as operator / operator-demo; more users above).",
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
            # Its own process group: Ctrl-C in the terminal reaches the demo only, and stop_group
            # stops the worker and its beat process together.
            start_new_session=True,
            env={
                **os.environ,
                "FENCELINE_WEBHOOK_ALLOWED_HOSTS": ",".join(sorted(settings.FENCELINE["WEBHOOK_ALLOWED_HOSTS"])),
            },
        )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_group(jobs: subprocess.Popen[bytes], *, grace_s: float = 10) -> None:
    """Stop the jobs' process group: SIGTERM (Celery's warm shutdown), then SIGKILL to whatever
    of the group is still there after ``grace_s``."""
    try:
        os.killpg(jobs.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        jobs.wait(grace_s)
    try:
        os.killpg(jobs.pid, signal.SIGKILL)  # the beat process may outlive the worker
    except ProcessLookupError:
        return
    jobs.wait(5)
