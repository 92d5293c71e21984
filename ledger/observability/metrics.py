"""Prometheus metrics at ``/metrics`` (docs/operations.md lists each with an alert rule).

Two sources, so that every replica answers the same and nothing is lost when a process dies:

- **The database, read at scrape time**, for everything it already holds: UNKNOWN outcomes,
  reconciliations by source, stale-token rejections, events accepted, verification, breakers,
  cost windows, credential leases, instances, resources, drains, restarts and the periodic
  jobs' heartbeats. Bounded aggregates over indexed columns, labelled by tenant. What the
  runs add up to takes a pass over every run: the count-run-totals job keeps it
  (``ledger/services/operating/totals.py``), and a scrape counts it only when the job is not
  fresh.
- **Process counters** (prometheus_client) for what the database does not keep: request
  latency per endpoint, lease acquisitions and renewals, duplicate rejections, retries by
  effect class. With ``PROMETHEUS_MULTIPROC_DIR`` set (gunicorn with several workers, the
  compose file), every process of the host writes its values there and a scrape sums them.

Labels stay bounded: tenant, job, state, kind, effect class, route, method, status code —
never a run, operation or worker id.
"""

import os
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any

from django.db.models import Count, F, Min, Q, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# --- process counters (incremented by the services and the request middleware) ------------

LEASE_ACQUISITIONS = Counter(
    "fenceline_lease_acquisitions", "Run leases taken: new (nobody held it) or takeover (of an expired lease)",
    ["tenant", "kind"],
)  # fmt: skip
LEASE_RENEWALS = Counter("fenceline_lease_renewals", "Run lease renewals accepted", ["tenant"])
DUPLICATE_REJECTIONS = Counter(
    "duplicate_rejections",
    "Intents whose idempotency key was already used: replay (the same operation answered, "
    "nothing done twice) or mismatch (other parameters, refused 422 IDEMPOTENCY_MISMATCH)",
    ["tenant", "kind"],
)
RETRY_BY_EFFECT_CLASS = Counter(
    "retry_by_effect_class", "New attempts started after FAILED or did-not-happen, by side-effect class",
    ["tenant", "effect_class"],
)  # fmt: skip
REQUEST_SECONDS = Histogram(
    "fenceline_http_request_duration_seconds",
    "Server time per request, by route pattern (never the path itself), method and status code",
    ["route", "method", "code"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

# Time spent in UNKNOWN, from the case's opening to its resolution.
UNKNOWN_BUCKETS_S = (60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600)


def _gauge(name: str, doc: str, labels: list[str], rows: Iterable[tuple]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for *values, number in rows:
        family.add_metric([str(v) for v in values], float(number or 0))
    return family


def _counter(name: str, doc: str, labels: list[str], rows: Iterable[tuple]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for *values, number in rows:
        family.add_metric([str(v) for v in values], float(number or 0))
    return family


class DatabaseMetrics(Collector):
    """What the database counts, read at scrape time (one query per family, grouped by tenant)."""

    def collect(self) -> Iterator[Metric]:
        from approvals.models import OPEN_CASE_STATUSES, ApprovalRequest, ApprovalStatus, ReconciliationCase
        from ledger.models import (
            CostShard,
            CostWindow,
            CredentialLease,
            JobHeartbeat,
            LeaseGrant,
            ResourceAlert,
            Run,
            RunLease,
            RunResource,
            Tenant,
            Worker,
            WorkerBoot,
            WorkerDrain,
        )
        from ledger.services.operating.totals import TOTALS, run_totals_read
        from ledger.states import BreakerState, InstanceState, ResourceState, RunStatus

        now = timezone.now()
        tenants = dict(Tenant.objects.values_list("pk", "slug"))

        def slug(pk: int) -> str:
            return tenants[pk]

        def by_tenant(rows: Iterable[Mapping[str, Any]], *keys: str, value: str = "n") -> list[tuple]:
            return [(slug(r["tenant_id"]), *(r[k] for k in keys), r[value]) for r in rows if r["tenant_id"] in tenants]

        # Breakers: 1 for the state each tenant is in, 0 for the others.
        breaker = GaugeMetricFamily(
            "fenceline_breaker_state", "1 for the cost breaker state the tenant is in", labels=["tenant", "state"]
        )
        for tenant_slug, state in Tenant.objects.values_list("slug", "breaker_state"):
            for choice in BreakerState.values:
                breaker.add_metric([tenant_slug, choice], 1.0 if state == choice else 0.0)
        yield breaker

        # Stale writes, counted on the run in the same transaction as the refusal.
        yield _counter(
            "fenceline_stale_token_rejections",
            "Writes refused because their fencing token was stale or the lease had expired (409 STALE_TOKEN / LEASE_LOST)",
            ["tenant"],
            by_tenant(
                Run.objects.filter(stale_rejections__gt=0)
                .values("tenant_id")
                .annotate(n=Sum("stale_rejections"))
                .order_by()
            ),
        )
        # The chain: events accepted (every run's head), runs found BROKEN, verification lag
        # and the newest verification: what the runs add up to, as the count-run-totals job
        # last counted them (counted here when it has not kept them fresh).
        totals = run_totals_read()
        runs = [{"tenant_id": t.tenant_id, **{k: getattr(t, k) for k in TOTALS}} for t in totals]
        yield _gauge(
            "fenceline_run_totals_age_seconds",
            "Seconds since the run totals below were counted (0: counted by this scrape)",
            ["tenant"],
            by_tenant(
                [{"tenant_id": t.tenant_id, "n": max(0.0, (now - t.counted_at).total_seconds())} for t in totals]
            ),
        )
        yield _counter(
            "audit_events_accepted",
            "Events appended to the runs' chains (the sum of every chain's head seq)",
            ["tenant"],
            by_tenant(runs, value="accepted"),
        )
        yield _counter(
            "audit_verification_failures",
            "Runs whose chain the verifier found BROKEN (first bad seq and reason on the run page)",
            ["tenant"],
            by_tenant(runs, value="broken"),
        )
        yield _gauge(
            "audit_unknown_outcomes",
            "Operations in phase UNKNOWN: dispatched, outcome not known, not yet reconciled",
            ["tenant"],
            by_tenant(runs, value="unknown"),
        )
        yield _gauge(
            "fenceline_verification_lag_events",
            "Events beyond each run's last verified checkpoint, summed (UNSEALED is normal while a run is active)",
            ["tenant"],
            by_tenant(runs, value="lag"),
        )
        yield _gauge("fenceline_active_runs", "Runs in status ACTIVE", ["tenant"], by_tenant(runs, value="active"))
        yield _gauge(
            "fenceline_seconds_since_verified_checkpoint",
            "Seconds since the verifier last verified a run of the tenant",
            ["tenant"],
            [(t, (now - at).total_seconds()) for t, at in by_tenant(runs, value="verified_at") if at is not None],
        )

        # UNKNOWN outcomes and their reconciliation (cases).
        open_cases = list(
            ReconciliationCase.objects.filter(status__in=OPEN_CASE_STATUSES)
            .values("tenant_id", "status")
            .annotate(n=Count("id"), oldest=Min("opened_at"))
            .order_by()
        )
        yield _gauge(
            "unknown_outcomes",
            "Open reconciliation cases (UNKNOWN effects), by case status: LOOKUP is a reconciler's, the rest people's",
            ["tenant", "status"],
            by_tenant(open_cases, "status"),
        )
        oldest: dict[str, float] = {}
        for row in open_cases:
            if row["tenant_id"] in tenants:
                age = (now - row["oldest"]).total_seconds()
                oldest[slug(row["tenant_id"])] = max(age, oldest.get(slug(row["tenant_id"]), 0.0))
        yield _gauge(
            "fenceline_unknown_outcome_oldest_age_seconds",
            "Age of the oldest open UNKNOWN case",
            ["tenant"],
            sorted(oldest.items()),
        )
        by_reconciler = Q(resolved_by__startswith="reconciler:")
        bucket_counts = {
            f"le_{s}": Count("id", filter=Q(resolved_at__lte=F("opened_at") + timedelta(seconds=s)))
            for s in UNKNOWN_BUCKETS_S
        }
        settled: list[dict[str, Any]] = [
            dict(row)
            for row in ReconciliationCase.objects.filter(status="RESOLVED")
            .values("tenant_id")
            .annotate(
                n=Count("id"),
                person=Count("id", filter=~by_reconciler),
                reconciler=Count("id", filter=by_reconciler),
                seconds=Sum(F("resolved_at") - F("opened_at")),
                **bucket_counts,
            )
            .order_by()
        ]
        reconciliations = CounterMetricFamily(
            "reconciliations", "UNKNOWN effects settled (RECONCILED), by who settled them", labels=["tenant", "source"]
        )
        in_unknown = HistogramMetricFamily(
            "unknown_outcome_duration_seconds",
            "Time settled UNKNOWN effects spent in UNKNOWN, from the case's opening to its resolution",
            labels=["tenant"],
        )
        for done in settled:
            if done["tenant_id"] not in tenants:
                continue
            tenant_slug = slug(done["tenant_id"])
            reconciliations.add_metric([tenant_slug, "person"], done["person"])
            reconciliations.add_metric([tenant_slug, "reconciler"], done["reconciler"])
            buckets = [(str(float(s)), float(done[f"le_{s}"])) for s in UNKNOWN_BUCKETS_S]
            buckets.append(("+Inf", float(done["n"])))
            total = done["seconds"].total_seconds() if done["seconds"] is not None else 0.0
            in_unknown.add_metric([tenant_slug], buckets, total)
        yield reconciliations
        yield in_unknown

        # Approvals: every request interrupted a run; those pending wait for a person now.
        approvals = list(
            ApprovalRequest.objects.values("tenant_id", "kind")
            .annotate(n=Count("id"), pending=Count("id", filter=Q(status=ApprovalStatus.PENDING, expires_at__gt=now)))
            .order_by()
        )
        yield _counter(
            "approval_interruptions",
            "Approval requests opened (a run waited for a person), by kind",
            ["tenant", "kind"],
            by_tenant(approvals, "kind"),
        )
        yield _gauge(
            "fenceline_approvals_pending",
            "Approval requests waiting for a person",
            ["tenant", "kind"],
            by_tenant(approvals, "kind", value="pending"),
        )

        # Leases and instances.
        takeovers = (
            LeaseGrant.objects.filter(previous_owner_id__isnull=False).values("tenant_id").annotate(n=Count("id"))
        )
        yield _counter(
            "fenceline_lease_takeovers",
            "Leases taken over from an owner whose lease had expired",
            ["tenant"],
            by_tenant(takeovers.order_by()),
        )
        live = (
            RunLease.objects.filter(
                owner_id__isnull=False, instance_state__in=[InstanceState.RUNNING, InstanceState.IDLE]
            )
            .values("run__tenant_id")
            .annotate(n=Count("run_id"))
            .order_by()
        )
        yield _gauge(
            "fenceline_live_instances",
            "Run instances owned by a worker (RUNNING or IDLE)",
            ["tenant"],
            [(slug(r["run__tenant_id"]), r["n"]) for r in live if r["run__tenant_id"] in tenants],
        )
        yield _gauge(
            "fenceline_active_operations",
            "Operations AUTHORIZED or DISPATCHED (in flight), to set against the live instances",
            ["tenant"],
            by_tenant(runs, value="in_flight"),
        )

        # Cost windows now open: limit, reserved and settled cents by budget kind.
        windows = list(
            CostWindow.objects.filter(starts_at__lte=now, ends_at__gt=now)
            .values("tenant_id", "kind")
            .annotate(limit=Sum("limit_cents"), reserved=Sum("reserved_cents"), settled=Sum("settled_cents"))
            .order_by()
        )
        # An escrowed window holds what its shards hold.
        escrowed = {
            (r["window__tenant_id"], r["window__kind"]): r
            for r in CostShard.objects.filter(window__starts_at__lte=now, window__ends_at__gt=now)
            .values("window__tenant_id", "window__kind")
            .annotate(reserved=Sum("reserved_cents"), settled=Sum("settled_cents"))
            .order_by()
        }
        for w in windows:
            shards = escrowed.get((w["tenant_id"], w["kind"]))
            if shards is not None:
                w["reserved"] += shards["reserved"]
                w["settled"] += shards["settled"]
        for value, doc in (
            ("limit", "limit"),
            ("reserved", "reserved (held for operations in flight)"),
            ("settled", "settled (spent)"),
        ):
            yield _gauge(
                f"fenceline_cost_{value}_cents",
                f"Cents {doc} in the cost windows open now, by budget kind",
                ["tenant", "kind"],
                by_tenant(windows, "kind", value=value),
            )

        # Credential leases: how many are live and how old the oldest is.
        leases = list(
            CredentialLease.objects.filter(revoked_at__isnull=True, expires_at__gt=now)
            .values("tenant_id")
            .annotate(n=Count("id"), oldest=Min("issued_at"))
            .order_by()
        )
        yield _gauge("fenceline_credential_leases_active", "Credential leases live", ["tenant"], by_tenant(leases))
        yield _gauge(
            "fenceline_credential_lease_oldest_age_seconds",
            "Age of the oldest live credential lease",
            ["tenant"],
            [(slug(r["tenant_id"]), (now - r["oldest"]).total_seconds()) for r in leases if r["tenant_id"] in tenants],
        )

        # Resources a run holds, their cleanup and the alerts it raised.
        ended = [RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.TIMED_OUT]
        unreleased = ~Q(state=ResourceState.RELEASED)
        resources = list(
            RunResource.objects.filter(unreleased)
            .values("tenant_id")
            .annotate(
                n=Count("id"),
                orphaned=Count("id", filter=Q(run__status__in=ended) | Q(state=ResourceState.CLEANUP_FAILED)),
                oldest=Min("release_requested_at"),
            )
            .order_by()
        )
        yield _gauge("fenceline_resources_open", "Resources not yet released", ["tenant"], by_tenant(resources))
        yield _gauge(
            "fenceline_orphaned_resources",
            "Resources still open although their run has ended, or whose cleanup failed",
            ["tenant"],
            by_tenant(resources, value="orphaned"),
        )
        yield _gauge(
            "fenceline_cleanup_oldest_pending_seconds",
            "Seconds since the oldest release request that is not yet confirmed (cleanup latency)",
            ["tenant"],
            [
                (slug(r["tenant_id"]), (now - r["oldest"]).total_seconds())
                for r in resources
                if r["tenant_id"] in tenants and r["oldest"] is not None
            ],
        )
        alerts = ResourceAlert.objects.filter(cleared_at__isnull=True).values("tenant_id").annotate(n=Count("id"))
        yield _gauge(
            "fenceline_cleanup_alerts_open",
            "Resources whose cleanup keeps failing or is past its deadline",
            ["tenant"],
            by_tenant(alerts.order_by()),
        )

        # Workers: status, drains, restarts.
        workers = Worker.objects.values("tenant_id", "status").annotate(n=Count("id")).order_by()
        yield _gauge(
            "fenceline_workers", "Workers by lifecycle status", ["tenant", "status"], by_tenant(workers, "status")
        )
        drains = WorkerDrain.objects.values("tenant_id", "outcome").annotate(n=Count("id")).order_by()
        yield _counter(
            "fenceline_drains",
            "Drains by outcome (empty while one is in progress)",
            ["tenant", "outcome"],
            [(t, outcome or "in_progress", n) for t, outcome, n in by_tenant(drains, "outcome")],
        )
        boots = list(
            WorkerBoot.objects.values("tenant_id")
            .annotate(
                restarts=Count("id", filter=Q(episode_boot__gt=1)), episodes=Count("id", filter=Q(episode_boot=2))
            )
            .order_by()
        )
        yield _counter(
            "fenceline_worker_restarts",
            "Boots within a restart episode",
            ["tenant"],
            by_tenant(boots, value="restarts"),
        )
        yield _counter(
            "fenceline_restart_episodes", "Restart episodes begun", ["tenant"], by_tenant(boots, value="episodes")
        )

        # The periodic jobs' heartbeats.
        beats = list(JobHeartbeat.objects.all())
        yield _gauge(
            "fenceline_job_seconds_since_finished",
            "Seconds since each periodic job last finished",
            ["job"],
            [(b.name, (now - b.last_finished_at).total_seconds()) for b in beats if b.last_finished_at],
        )
        yield _counter(
            "fenceline_job_runs", "Runs of each periodic job that finished", ["job"], [(b.name, b.runs) for b in beats]
        )
        yield _counter(
            "fenceline_job_failures",
            "Runs of each periodic job that failed",
            ["job"],
            [(b.name, b.failures) for b in beats],
        )
        yield _gauge(
            "fenceline_job_last_duration_seconds",
            "How long each job's last run took",
            ["job"],
            [(b.name, b.last_duration_ms / 1000) for b in beats],
        )
        yield _counter(
            "fenceline_job_items",
            "What the periodic jobs' runs have done, summed (e.g. reap-leases / leases: leases expired)",
            ["job", "item"],
            [(b.name, item, n) for b in beats for item, n in sorted(b.totals.items())],
        )
        reaped = next((b.totals.get("leases", 0) for b in beats if b.name == "reap-leases"), 0)
        yield _counter("fenceline_lease_expiries", "Expired leases the lease reaper ended", [], [(reaped,)])


class _ThisProcess(Collector):
    """The process counters of this process (when there is no multiprocess directory)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def scrape() -> bytes:
    """The text exposition of every metric: the database's and the processes'."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    registry.register(DatabaseMetrics())
    return generate_latest(registry)
