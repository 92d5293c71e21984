"""`python manage.py demo`: migrate, seed a demo tenant through the real services, then
serve the console and API with the background jobs (a Celery worker with beat)."""

import contextlib
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.test import override_settings
from django.utils import timezone

from approvals.models import ApprovalRequest, ReconciliationCase
from approvals.services.approvals import approvals_expire
from approvals.services.lookups import cases_look_up
from approvals.services.notifications import notifications_scan
from ledger.errors import ApprovalRequired, Denied, StaleToken
from ledger.models import Event, Operation, Run, RunLease, RunResource, Worker
from ledger.models.notifications import NotificationKind
from ledger.services.authority.credential_leases import credential_lease_issue, credential_lease_revoke
from ledger.services.authority.credentials import credential_create
from ledger.services.authority.policy import policy_change
from ledger.services.core.intent import Intent
from ledger.services.evidence.append import build_event
from ledger.services.evidence.verification import ledger_verify
from ledger.services.fence import leases, notes, operations, outcomes, runs
from ledger.services.fence.ending import run_cancel
from ledger.services.fleet.lifecycle import worker_drain, worker_quarantine
from ledger.services.fleet.workers import worker_create, worker_rotate_token
from ledger.services.lifespan import resources
from ledger.services.lifespan.checkpoints import checkpoint_save
from ledger.services.lifespan.reaper import resources_reap
from ledger.services.notifications.delivery import deliveries_send
from ledger.services.notifications.endpoints import endpoint_create
from ledger.services.reconciliation.http import HttpReconciler
from ledger.services.reconciliation.registry import register
from ledger.services.tenancy.roles import role_grant
from ledger.services.tenancy.tenants import tenant_ensure
from ledger.services.upgrades import provider_ref
from ledger.services.upgrades.backfill import backfill_run
from ledger.services.upgrades.conflicts import conflict_open
from ledger.simulation.provider import SandboxProvider
from ledger.states import EffectClass

TENANT = "demo"
WORKER = "demo-worker"
DEMO_CONTRACTS = [
    {
        "tool": "payments",
        "action": "charge",
        "effect_class": "NON_RETRYABLE",
        "provider": "sandbox-payments",
        "reconciler": "sandbox-payments",
        "worst_case_cost_cents": 5000,
    },
    {"tool": "search", "action": "*", "effect_class": "PURE"},
]
DEMO_USERS = [("viewer", "viewer"), ("operator", "operator"), ("approver", "approver"), ("admin", "admin")]


class Command(BaseCommand):
    help = "Seed a demo tenant and worker, then serve the console and API with background jobs."

    def add_arguments(self, parser):
        parser.add_argument(
            "addrport", nargs="?", default="127.0.0.1:8000", help="where to serve (default 127.0.0.1:8000)"
        )
        parser.add_argument("--no-serve", action="store_true", help="seed and print the token, then exit")
        parser.add_argument("--no-jobs", action="store_true", help="do not start the Celery worker and beat")

    def handle(self, *args, addrport, no_serve, no_jobs, **options):
        self.jobs_log = settings.STATE_DIR / "demo-jobs.log"
        self.stdout.write("migrating the database ...")
        call_command("migrate", interactive=False, verbosity=0)
        self.sandbox = self.start_sandbox()
        token = self.seed()
        host = addrport if ":" in addrport else f"127.0.0.1:{addrport}"
        ready = self.ready_text(host, token)
        if no_serve:
            self.stdout.write(ready)
            return
        jobs = None if no_jobs else self.start_jobs()
        # The token and the curl line come last, once the server answers: Celery's and the
        # server's start-up lines would otherwise scroll them away.
        threading.Thread(target=self.announce_when_up, args=(host, ready), daemon=True).start()
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

    def seed(self) -> str:
        tenant, _ = tenant_ensure(slug=TENANT, name="Demo tenant")
        existing = Worker.objects.filter(tenant=tenant, name=WORKER).first()
        if existing is not None:
            self.show_users()
            return worker_rotate_token(worker=existing)
        worker, token = worker_create(tenant=tenant, name=WORKER)
        self.stdout.write("seeding demo tenants, users and runs through the services ...")
        for username, role in DEMO_USERS:
            role_grant(username=username, tenant=tenant, role=role, password=f"{username}-demo")
        self.seed_runs(worker)
        self.seed_other_tenants()
        result = ledger_verify(limit=1000)
        self.stdout.write(f"verified {result.runs} runs ({result.broken} BROKEN, as seeded)")
        self.seed_webhooks(tenant)
        self.show_users()
        return token

    def show_users(self) -> None:
        self.stdout.write("Console users (password = <user>-demo), on tenants 'demo' and 'initech':")
        for username, role in DEMO_USERS:
            self.stdout.write(f"  {username:<9} {role}")
        self.stdout.write("  globex-admin admin on tenant 'globex' only (sees nothing of 'demo')")

    def seed_runs(self, worker: Worker) -> None:
        tenant = worker.tenant

        def leased(external_id: str, owner: str = "agent-a", ttl_s: int = 3600):
            run, _ = runs.run_create(worker=worker, schema_version=1, external_id=external_id)
            token = leases.lease_acquire(worker=worker, run_id=run.pk, owner_id=owner, ttl_s=ttl_s).fencing_token
            return run, token

        def intend(
            run,
            token,
            key,
            *,
            tool="github",
            action="create_issue",
            resource="repo:acme/web",
            effect="IDEMPOTENT",
            provider="",
        ):
            intent = Intent(
                tool=tool, action=action, resource=resource, effect_class=effect, idempotency_key=key, provider=provider
            )
            return operations.operation_intend(worker=worker, run_id=run.pk, fencing_token=token, intent=intent)[0]

        def dispatch(run, token, key, **kw):
            op = intend(run, token, key, **kw)
            operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
            return operations.operation_dispatch(worker=worker, operation_id=op.pk, fencing_token=token)

        def outcome(op, token, result, **kw):
            return outcomes.operation_report_outcome(
                worker=worker, operation_id=op.pk, fencing_token=token, outcome=result, **kw
            )

        # Verified: an effect confirmed, the run completed and sealed.
        run, token = leased("demo-confirmed")
        outcome(dispatch(run, token, "demo:issue:1"), token, "CONFIRMED", provider_request_id="gh-1001")
        runs.run_complete(worker=worker, run_id=run.pk, fencing_token=token)

        # A stalled owner fenced: its in-flight effect is UNKNOWN with a case, and its late
        # report is kept as unverified evidence.
        run, token = leased("demo-takeover", owner="agent-stalled", ttl_s=60)
        op = dispatch(
            run,
            token,
            "demo:email:7",
            tool="email",
            action="send",
            resource="mailto:ops@example.com",
            effect="NON_RETRYABLE",
        )
        RunLease.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))  # the demo's clock
        leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="agent-rescue", ttl_s=3600)
        with contextlib.suppress(StaleToken):  # expected: that is the point of this run
            outcome(op, token, "CONFIRMED", provider_request_id="msg-77")

        # UNKNOWN without stale evidence: the provider timed out after accepting.
        run, token = leased("demo-timeout")
        outcome(
            dispatch(run, token, "demo:deploy:3", tool="deploy", action="release", resource="service:web"),
            token,
            "UNKNOWN",
            error_code="READ_TIMEOUT",
        )

        # Provider lookups before people: two charges whose answers were lost. The sandbox
        # provider has the first one (the reconciler settles it: RECONCILED by
        # reconciler:sandbox-payments, with the charge id); of the second it cannot tell, so
        # it waits in the queue for a person, with the lookup on the case.
        self.seed_lookups(leased, dispatch, outcome)
        self.seed_upgrade(leased, dispatch, outcome)

        # Approvals: payments always need a person. One pending, one expired. The payments
        # contract: what a charge is, whatever a worker says, and who looks it up.
        policy_change(
            tenant=tenant,
            document={"human_approval_tools": ["payments"], "tool_contracts": DEMO_CONTRACTS},
            changed_by="admin",
            reason="payments need a person; the tool contracts of payments and search",
        )
        run, token = leased("demo-approvals")
        pending = intend(
            run,
            token,
            "demo:charge:17",
            tool="payments",
            action="charge",
            resource="customer:881",
            effect="NON_RETRYABLE",
        )
        expired = intend(
            run,
            token,
            "demo:charge:18",
            tool="payments",
            action="charge",
            resource="customer:882",
            effect="NON_RETRYABLE",
        )
        for op in (pending, expired):
            with contextlib.suppress(ApprovalRequired):
                operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
        ApprovalRequest.objects.filter(operation=expired).update(expires_at=timezone.now() - timedelta(seconds=1))
        approvals_expire()

        # A revoked credential lease that refused a dispatch.
        credential_create(tenant=tenant, principal="github-bot", secret_ref="vault:kv/github-bot")  # noqa: S106 - a reference, not a secret
        run, token = leased("demo-revoked")
        lease = credential_lease_issue(
            worker=worker,
            run_id=run.pk,
            fencing_token=token,
            principal="github-bot",
            actions=["push"],
            resources=["repo:acme/web"],
            ttl_s=3600,
        )
        op = intend(run, token, "demo:push:5", tool="git", action="push", resource="repo:acme/web")
        operations.operation_authorize(
            worker=worker, operation_id=op.pk, fencing_token=token, credential_lease_id=lease.pk
        )
        credential_lease_revoke(
            tenant=tenant, lease_id=lease.pk, revoked_by="admin", reason="token seen in a build log"
        )
        with contextlib.suppress(Denied):  # DENY_REVOKED, as intended
            operations.operation_dispatch(worker=worker, operation_id=op.pk, fencing_token=token)

        # A run whose chain is BROKEN: an event slipped in past the recorded head, hashed and
        # linked like the real thing by an intruder without the event key (so no MAC).
        run, token = leased("demo-broken")
        notes.event_append(worker=worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"step": "checked"})
        forged = build_event(
            Run.objects.get(pk=run.pk),
            type="NOTE",
            actor="worker:intruder/x",
            fields={"step": "forged"},
            occurred_at=timezone.now(),
        )
        forged.mac_key_id = forged.mac = ""
        Event.objects.bulk_create([forged])  # INSERT is what the trigger allows; the head does not move

        # Active credential leases for an admin to preview and revoke in the console; one
        # operation is authorized under them and not yet dispatched.
        credential_create(tenant=tenant, principal="deploy-bot", secret_ref="vault:kv/deploy-bot")  # noqa: S106 - a reference, not a secret
        run, token = leased("demo-deploy")
        issued = [
            credential_lease_issue(
                worker=worker,
                run_id=run.pk,
                fencing_token=token,
                principal="deploy-bot",
                actions=["release"],
                resources=[resource],
                ttl_s=3600,
            )
            for resource in ("service:web", "service:api")
        ]
        op = intend(run, token, "demo:release:9", tool="deploy", action="release", resource="service:web")
        operations.operation_authorize(
            worker=worker, operation_id=op.pk, fencing_token=token, credential_lease_id=issued[0].pk
        )

        # A worker that lost its lease (a restart episode), then was quarantined; another draining.
        flaky, _ = worker_create(tenant=tenant, name="flaky-worker")
        run, _ = runs.run_create(worker=flaky, schema_version=1, external_id="demo-flaky")
        flaky_token = leases.lease_acquire(worker=flaky, run_id=run.pk, owner_id="flaky-1", ttl_s=60).fencing_token
        # It saved its progress before it vanished: the rescue worker resumes from page 3.
        checkpoint_save(
            worker=flaky, run_id=run.pk, fencing_token=flaky_token, position="page-3", state={"pages_done": [1, 2, 3]}
        )
        RunLease.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))  # the demo's clock
        leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="agent-rescue", ttl_s=3600)
        worker_quarantine(worker_id=flaky.pk, reason="lost its lease and kept writing", name="admin")
        batch, _ = worker_create(tenant=tenant, name="batch-worker")
        run, _ = runs.run_create(worker=batch, schema_version=1, external_id="demo-batch")
        leases.lease_acquire(worker=batch, run_id=run.pk, owner_id="batch-1", ttl_s=3600)
        worker_drain(worker_id=batch.pk, reason="host maintenance tonight", deadline_s=3600, name="admin")
        self.seed_lifespan(tenant, worker)

    def seed_webhooks(self, tenant) -> None:
        """A webhook of the demo tenant to the sandbox's sink, for every kind of notification:
        one scan and one delivery pass now (the approval, the quarantine, the cleanup alert
        and the BROKEN chain seeded above), the jobs deliver the rest while the demo runs
        (the UNKNOWNs, once they are a minute old)."""
        endpoint_create(
            tenant=tenant,
            name="ops-channel",
            target=self.sandbox.url + "/v1/webhooks",
            kinds=NotificationKind.values,
            unknown_after_s=60,
            reason="the on-call channel (the sandbox's sink in the demo)",
            created_by="admin",
        )
        scanned = notifications_scan()
        sent = deliveries_send()
        self.stdout.write(
            f"webhooks: {scanned.created} notification(s) for ops-channel, {sent.delivered} delivered to the "
            f"sandbox sink ({sum(1 for w in self.sandbox.webhooks if w['signed'])} signed)"
        )

    def seed_lookups(self, leased, dispatch, outcome) -> None:
        sandbox = self.sandbox
        lost, unclear = "demo:charge:lost-answer", "demo:charge:cannot-tell"
        run, token = leased("demo-lookups")
        for key in (lost, unclear):
            op = dispatch(
                run,
                token,
                key,
                tool="payments",
                action="charge",
                resource="customer:901",
                effect="NON_RETRYABLE",
                provider="sandbox-payments",
            )
            with contextlib.suppress(requests.ConnectionError):  # the answer is lost on the way back
                requests.post(
                    sandbox.url + "/v1/charges",
                    headers={"Idempotency-Key": key, "Sandbox-Fault": "drop"},
                    json={"amount_cents": 1900, "customer": "c:901"},
                    timeout=5,
                )
            outcome(op, token, "UNKNOWN", error_code="READ_TIMEOUT")
        sandbox.cannot_tell_keys.add(unclear)
        with override_settings(FENCELINE={**settings.FENCELINE, "RECONCILE_AFTER_S": 0}):
            ReconciliationCase.objects.filter(run=run).update(next_lookup_at=timezone.now())
            result = cases_look_up()
        self.stdout.write(
            f"provider lookups: {result.happened} settled by reconciler:sandbox-payments, "
            f"{result.to_people} handed to people"
        )

    def seed_upgrade(self, leased, dispatch, outcome) -> None:
        """The upgrade window of operation.provider_ref (EXPAND): a report in the new form
        (provider_ref) is dual-written; then a process of the old build rewrites the bare id
        of another operation, so its two representations disagree. The dry-run backfill counts
        it, and it is opened as a StateConflict, as a reader that must act on it opens one
        (a lookup, a case resolution, the backfill): the run's automation stops until a
        person decides on /upgrades/."""
        run, token = leased("demo-upgrade")
        outcome(dispatch(run, token, "demo:issue:21"), token, "CONFIRMED", provider_ref={"id": "gh-2001"})
        run, token = leased("demo-upgrade-conflict")
        op = outcome(dispatch(run, token, "demo:issue:22"), token, "CONFIRMED", provider_request_id="gh-2002")
        Operation.objects.filter(pk=op.pk).update(provider_request_id="gh-2003")  # the old build's write
        seen = backfill_run(provider_ref.CHANGE, dry_run=True)
        conflict_open(operation_id=op.pk, found_by="demo: the backfill's dry run")
        self.stdout.write(
            f"upgrade window: operation.provider_ref in {provider_ref.phase_now()}; the dry-run backfill would move "
            f"{seen.changed} of {seen.scanned} operations and found {seen.conflicts} conflict (see /upgrades/)"
        )

    def seed_lifespan(self, tenant, worker: Worker) -> None:
        """What runs hold and how they end: a worker that vanished with two browser sessions
        (the reaper closes them once the jobs run), a connection nobody can close (its
        cleanup keeps failing and raises an alert), and a run an operator cancelled."""
        leaky, _ = worker_create(tenant=tenant, name="leaky-worker")
        run, _ = runs.run_create(worker=leaky, schema_version=1, external_id="demo-leaky")
        token = leases.lease_acquire(worker=leaky, run_id=run.pk, owner_id="leaky-1", ttl_s=60).fencing_token
        for n in (1, 2):
            resources.resource_attach(
                worker=leaky,
                run_id=run.pk,
                fencing_token=token,
                attach=resources.Attach(
                    kind="browser_session", provider="sandbox", handle=f"supplier-portal-{n}", idle_s=600
                ),
            )
        RunLease.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))  # it vanished

        run, _ = runs.run_create(worker=worker, schema_version=1, external_id="demo-legacy-crm")
        token = leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="agent-a", ttl_s=3600).fencing_token
        stuck, _ = resources.resource_attach(
            worker=worker,
            run_id=run.pk,
            fencing_token=token,
            attach=resources.Attach(kind="connection", provider="legacy-crm", handle="crm-conn-7"),
        )
        runs.run_complete(worker=worker, run_id=run.pk, fencing_token=token)
        for _ in range(3):  # no driver knows legacy-crm: three failed cleanups raise an alert
            RunResource.objects.filter(pk=stuck.pk).update(next_attempt_at=timezone.now())  # the demo's clock
            resources_reap()

        run, _ = runs.run_create(worker=worker, schema_version=1, external_id="demo-cancelled")
        leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="agent-a", ttl_s=3600)
        run_cancel(tenant=tenant, run_id=run.pk, reason="the customer withdrew the request", actor="user:operator")

    def seed_other_tenants(self) -> None:
        # Another tenant: the demo users see nothing of it.
        globex, _ = tenant_ensure(slug="globex", name="Globex")
        role_grant(username="globex-admin", tenant=globex, role="admin", password="globex-admin-demo")  # noqa: S106 - the documented demo sign-in
        other, _ = worker_create(tenant=globex, name="globex-worker")
        run, _ = runs.run_create(worker=other, schema_version=1, external_id="globex-run")
        leases.lease_acquire(worker=other, run_id=run.pk, owner_id="g-agent", ttl_s=3600)

        # A tenant whose cost breaker is DEGRADED: 900 of its 1,000 cents are reserved.
        initech, _ = tenant_ensure(slug="initech", name="Initech")
        policy_change(
            tenant=initech,
            document={"cost_limits_cents": {"run": None, "tenant": 1000, "retry": None, "provider": {}}},
            changed_by="admin",
            reason="a small spend cap",
        )
        for username, role in DEMO_USERS:  # the demo users work on initech too, in the same roles
            role_grant(username=username, tenant=initech, role=role)
        spender, _ = worker_create(tenant=initech, name="initech-worker")
        run, _ = runs.run_create(worker=spender, schema_version=1, external_id="initech-spend")
        token = leases.lease_acquire(worker=spender, run_id=run.pk, owner_id="i-agent", ttl_s=3600).fencing_token
        intent = Intent(
            tool="llm",
            action="complete",
            resource="model:large",
            effect_class=EffectClass.PURE,
            idempotency_key="i:1",
            estimated_cost_cents=900,
        )
        op, _ = operations.operation_intend(worker=spender, run_id=run.pk, fencing_token=token, intent=intent)
        operations.operation_authorize(worker=spender, operation_id=op.pk, fencing_token=token)
        operations.operation_dispatch(worker=spender, operation_id=op.pk, fencing_token=token)

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
        self.stdout.write(
            f"sandbox payments provider at {sandbox.url} (reconciler sandbox-payments looks charges up there)"
        )
        return sandbox

    def start_jobs(self) -> subprocess.Popen:
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
        )
