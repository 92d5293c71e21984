"""What the database counts, read at scrape time: the ledger's metric families.

A collector is a sequence of families, each a small function of one :class:`Scrape` (the
moment it was taken and the tenants' slugs) that yields what one question answers: one query
per family, grouped by tenant, over indexed columns. The approvals app's families (cases and
approval requests) are a collector of their own (``approvals/metrics.py``), registered beside
this one (``ledger.observability.metrics.register``).
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from functools import cached_property
from typing import Any, ClassVar

from django.db.models import Count, Min, Q, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ledger.models import (
    RESTART_EPISODE_BEGINS,
    CostShard,
    CostWindow,
    CredentialLease,
    FlowSlot,
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
from ledger.observability.cost_report import REPORT_WINDOW, lever_reports
from ledger.observability.stuck import STUCK_METRIC_CAP, stuck_counts
from ledger.observability.totals import TOTALS, run_totals_read
from ledger.states import BreakerState, InstanceState, ResourceState, RunStatus

# A metric's row as the database answers it: its label values, then its number.
type Row = tuple[Any, ...]


def gauge(name: str, doc: str, labels: list[str], rows: Iterable[Row]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for *values, number in rows:
        family.add_metric([str(v) for v in values], float(number or 0))
    return family


def counter(name: str, doc: str, labels: list[str], rows: Iterable[Row]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for *values, number in rows:
        family.add_metric([str(v) for v in values], float(number or 0))
    return family


class Scrape:
    """One scrape as its families see it: when it was taken and the tenants' slugs; the run
    totals are read once, by the first family that asks."""

    def __init__(self) -> None:
        self.now: datetime = timezone.now()
        self.tenants: dict[int, str] = dict(Tenant.objects.values_list("pk", "slug"))

    def slug(self, pk: int) -> str:
        return self.tenants[pk]

    def by_tenant(self, rows: Iterable[Mapping[str, Any]], *keys: str, value: str = "n") -> list[Row]:
        """(tenant slug, *keys, value) of each row of a known tenant."""
        return [
            (self.slug(r["tenant_id"]), *(r[k] for k in keys), r[value]) for r in rows if r["tenant_id"] in self.tenants
        ]

    @cached_property
    def runs(self) -> list[dict[str, Any]]:
        """What each tenant's runs add up to, as the count-run-totals job last counted them."""
        return [
            {"tenant_id": t.tenant_id, "counted_at": t.counted_at, **{k: getattr(t, k) for k in TOTALS}}
            for t in run_totals_read()
        ]


Family = Callable[[Scrape], Iterable[Metric]]


class DatabaseCollector(Collector):
    """The families of ``families``, in order, read at scrape time from one :class:`Scrape`."""

    families: ClassVar[tuple[Family, ...]] = ()

    def collect(self) -> Iterator[Metric]:
        scrape = Scrape()
        for family in self.families:
            yield from family(scrape)


def breakers(scrape: Scrape) -> Iterator[Metric]:
    """1 for the state each tenant's cost breaker is in, 0 for the others."""
    breaker = GaugeMetricFamily(
        "fenceline_breaker_state", "1 for the cost breaker state the tenant is in", labels=["tenant", "state"]
    )
    for tenant_slug, state in Tenant.objects.values_list("slug", "breaker_state"):
        for choice in BreakerState.values:
            breaker.add_metric([tenant_slug, choice], 1.0 if state == choice else 0.0)
    yield breaker


def stale_writes(scrape: Scrape) -> Iterator[Metric]:
    """Stale writes, counted on the run in the same transaction as the refusal."""
    yield counter(
        "fenceline_stale_token_rejections",
        "Writes refused because their fencing token was stale or the lease had expired (409 STALE_TOKEN / LEASE_LOST)",
        ["tenant"],
        scrape.by_tenant(
            Run.objects.filter(stale_rejections__gt=0)
            .values("tenant_id")
            .annotate(n=Sum("stale_rejections"))
            .order_by()
        ),
    )


def run_totals(scrape: Scrape) -> Iterator[Metric]:
    """The chain: events accepted (every run's head), runs found BROKEN, verification lag and
    the newest verification: what the runs add up to, as the count-run-totals job last counted
    them (counted here when it has not kept them fresh)."""
    runs, now = scrape.runs, scrape.now
    yield gauge(
        "fenceline_run_totals_age_seconds",
        "Seconds since the run totals below were counted (0: counted by this scrape)",
        ["tenant"],
        scrape.by_tenant(
            [{"tenant_id": r["tenant_id"], "n": max(0.0, (now - r["counted_at"]).total_seconds())} for r in runs]
        ),
    )
    yield counter(
        "audit_events_accepted",
        "Events appended to the runs' chains (the sum of every chain's head seq)",
        ["tenant"],
        scrape.by_tenant(runs, value="accepted"),
    )
    yield counter(
        "audit_verification_failures",
        "Runs whose chain the verifier found BROKEN (first bad seq and reason on the run page)",
        ["tenant"],
        scrape.by_tenant(runs, value="broken"),
    )
    yield gauge(
        "audit_unknown_outcomes",
        "Operations in phase UNKNOWN: dispatched, outcome not known, not yet reconciled",
        ["tenant"],
        scrape.by_tenant(runs, value="unknown"),
    )
    yield gauge(
        "fenceline_verification_lag_events",
        "Events beyond each run's last verified checkpoint, summed (UNSEALED is normal while a run is active)",
        ["tenant"],
        scrape.by_tenant(runs, value="lag"),
    )
    yield gauge("fenceline_active_runs", "Runs in status ACTIVE", ["tenant"], scrape.by_tenant(runs, value="active"))
    yield gauge(
        "fenceline_seconds_since_verified_checkpoint",
        "Seconds since the verifier last verified a run of the tenant",
        ["tenant"],
        [(t, (now - at).total_seconds()) for t, at in scrape.by_tenant(runs, value="verified_at") if at is not None],
    )


def leases_and_instances(scrape: Scrape) -> Iterator[Metric]:
    """Leases taken over, live instances, and the operations in flight beside them."""
    takeovers = LeaseGrant.objects.filter(previous_owner_id__isnull=False).values("tenant_id").annotate(n=Count("id"))
    yield counter(
        "fenceline_lease_takeovers",
        "Leases taken over from an owner whose lease had expired",
        ["tenant"],
        scrape.by_tenant(takeovers.order_by()),
    )
    live = (
        RunLease.objects.filter(owner_id__isnull=False, instance_state__in=[InstanceState.RUNNING, InstanceState.IDLE])
        .values("run__tenant_id")
        .annotate(n=Count("run_id"))
        .order_by()
    )
    yield gauge(
        "fenceline_live_instances",
        "Run instances owned by a worker (RUNNING or IDLE)",
        ["tenant"],
        [(scrape.slug(r["run__tenant_id"]), r["n"]) for r in live if r["run__tenant_id"] in scrape.tenants],
    )
    yield gauge(
        "fenceline_active_operations",
        "Operations AUTHORIZED or DISPATCHED (in flight), to set against the live instances",
        ["tenant"],
        scrape.by_tenant(scrape.runs, value="in_flight"),
    )


def stuck_runs(scrape: Scrape) -> Iterator[Metric]:
    """ACTIVE runs with no lease or no progress past their tenant's ``stuck_after_s``
    (``ledger.observability.stuck``), counted up to STUCK_METRIC_CAP + 1 per tenant."""
    counts = stuck_counts(list(scrape.tenants), cap=STUCK_METRIC_CAP, now=scrape.now)
    yield gauge(
        "fenceline_stuck_runs",
        f"ACTIVE runs with no lease or no progress for longer than the tenant's stuck_after_s "
        f"(counted up to {STUCK_METRIC_CAP + 1}: more reads as {STUCK_METRIC_CAP + 1})",
        ["tenant"],
        [(scrape.slug(pk), n) for pk, n in sorted(counts.items())],
    )


def cost_windows(scrape: Scrape) -> Iterator[Metric]:
    """Cost windows open now: limit, reserved and settled cents by budget kind (an escrowed
    window holds what its shards hold)."""
    now = scrape.now
    windows = list(
        CostWindow.objects.filter(starts_at__lte=now, ends_at__gt=now)
        .values("tenant_id", "kind")
        .annotate(limit=Sum("limit_cents"), reserved=Sum("reserved_cents"), settled=Sum("settled_cents"))
        .order_by()
    )
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
        yield gauge(
            f"fenceline_cost_{value}_cents",
            f"Cents {doc} in the cost windows open now, by budget kind",
            ["tenant", "kind"],
            scrape.by_tenant(windows, "kind", value=value),
        )


def credential_leases(scrape: Scrape) -> Iterator[Metric]:
    """How many credential leases are live, and how old the oldest is."""
    now = scrape.now
    leases = list(
        CredentialLease.objects.filter(revoked_at__isnull=True, expires_at__gt=now)
        .values("tenant_id")
        .annotate(n=Count("id"), oldest=Min("issued_at"))
        .order_by()
    )
    yield gauge("fenceline_credential_leases_active", "Credential leases live", ["tenant"], scrape.by_tenant(leases))
    yield gauge(
        "fenceline_credential_lease_oldest_age_seconds",
        "Age of the oldest live credential lease",
        ["tenant"],
        [
            (scrape.slug(r["tenant_id"]), (now - r["oldest"]).total_seconds())
            for r in leases
            if r["tenant_id"] in scrape.tenants
        ],
    )


def resources(scrape: Scrape) -> Iterator[Metric]:
    """Resources a run holds, their cleanup and the alerts it raised."""
    ended = [RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.TIMED_OUT]
    rows = list(
        RunResource.objects.filter(~Q(state=ResourceState.RELEASED))
        .values("tenant_id")
        .annotate(
            n=Count("id"),
            orphaned=Count("id", filter=Q(run__status__in=ended) | Q(state=ResourceState.CLEANUP_FAILED)),
            oldest=Min("release_requested_at"),
        )
        .order_by()
    )
    yield gauge("fenceline_resources_open", "Resources not yet released", ["tenant"], scrape.by_tenant(rows))
    yield gauge(
        "fenceline_orphaned_resources",
        "Resources still open although their run has ended, or whose cleanup failed",
        ["tenant"],
        scrape.by_tenant(rows, value="orphaned"),
    )
    yield gauge(
        "fenceline_cleanup_oldest_pending_seconds",
        "Seconds since the oldest release request that is not yet confirmed (cleanup latency)",
        ["tenant"],
        [
            (scrape.slug(r["tenant_id"]), (scrape.now - r["oldest"]).total_seconds())
            for r in rows
            if r["tenant_id"] in scrape.tenants and r["oldest"] is not None
        ],
    )
    alerts = ResourceAlert.objects.filter(cleared_at__isnull=True).values("tenant_id").annotate(n=Count("id"))
    yield gauge(
        "fenceline_cleanup_alerts_open",
        "Resources whose cleanup keeps failing or is past its deadline",
        ["tenant"],
        scrape.by_tenant(alerts.order_by()),
    )


def workers(scrape: Scrape) -> Iterator[Metric]:
    """Workers: status, drains, restarts."""
    statuses = Worker.objects.values("tenant_id", "status").annotate(n=Count("id")).order_by()
    yield gauge(
        "fenceline_workers", "Workers by lifecycle status", ["tenant", "status"], scrape.by_tenant(statuses, "status")
    )
    drains = WorkerDrain.objects.values("tenant_id", "outcome").annotate(n=Count("id")).order_by()
    yield counter(
        "fenceline_drains",
        "Drains by outcome (empty while one is in progress)",
        ["tenant", "outcome"],
        [(t, outcome or "in_progress", n) for t, outcome, n in scrape.by_tenant(drains, "outcome")],
    )
    boots = list(
        WorkerBoot.objects.values("tenant_id")
        .annotate(
            restarts=Count("id", filter=Q(episode_boot__gt=1)), episodes=Count("id", filter=RESTART_EPISODE_BEGINS)
        )
        .order_by()
    )
    yield counter(
        "fenceline_worker_restarts",
        "Boots within a restart episode",
        ["tenant"],
        scrape.by_tenant(boots, value="restarts"),
    )
    yield counter(
        "fenceline_restart_episodes", "Restart episodes begun", ["tenant"], scrape.by_tenant(boots, value="episodes")
    )


def jobs(scrape: Scrape) -> Iterator[Metric]:
    """The periodic jobs' heartbeats."""
    beats = list(JobHeartbeat.objects.all())
    yield gauge(
        "fenceline_job_seconds_since_finished",
        "Seconds since each periodic job last finished",
        ["job"],
        [(b.name, (scrape.now - b.last_finished_at).total_seconds()) for b in beats if b.last_finished_at],
    )
    yield counter(
        "fenceline_job_runs", "Runs of each periodic job that finished", ["job"], [(b.name, b.runs) for b in beats]
    )
    yield counter(
        "fenceline_job_failures",
        "Runs of each periodic job that failed",
        ["job"],
        [(b.name, b.failures) for b in beats],
    )
    yield gauge(
        "fenceline_job_last_duration_seconds",
        "How long each job's last run took",
        ["job"],
        [(b.name, b.last_duration_ms / 1000) for b in beats],
    )
    yield counter(
        "fenceline_job_items",
        "What the periodic jobs' runs have done, summed (e.g. reap-leases / leases: leases expired)",
        ["job", "item"],
        [(b.name, item, n) for b in beats for item, n in sorted(b.totals.items())],
    )
    reaped = next((b.totals.get("leases", 0) for b in beats if b.name == "reap-leases"), 0)
    yield counter("fenceline_lease_expiries", "Expired leases the lease reaper ended", [], [(reaped,)])


def flow_in_flight(scrape: Scrape) -> Iterator[Metric]:
    """Concurrency places held now (operations DISPATCHED under a limit), by key kind."""
    held: dict[tuple[int, str], int] = {}
    rows = (
        FlowSlot.objects.filter(operation__isnull=False).values("tenant_id", "key").annotate(n=Count("id")).order_by()
    )
    for row in rows:
        kind = row["key"].split(":", 1)[0]
        held[row["tenant_id"], kind] = held.get((row["tenant_id"], kind), 0) + row["n"]
    yield gauge(
        "fenceline_flow_in_flight",
        "Operations DISPATCHED holding a concurrency place, by key kind (tenant, tool, provider, key)",
        ["tenant", "kind"],
        [
            (scrape.slug(tenant_id), kind, n)
            for (tenant_id, kind), n in sorted(held.items())
            if tenant_id in scrape.tenants
        ],
    )


def levers(scrape: Scrape) -> Iterator[Metric]:
    """What the cost breaker's levers did over the last hour (``ledger/observability/cost_report.py``):
    cost by provider, UNKNOWN cents, retry cost, fallback rate and denials by reason."""
    reports = {
        scrape.tenants[pk]: r
        for pk, r in lever_reports(since=scrape.now - REPORT_WINDOW).items()
        if pk in scrape.tenants
    }
    window = "over the last hour"
    yield gauge(
        "fenceline_cost_by_provider_cents",
        f"Cents of the dispatches reserved {window}, by provider and reservation state (settled, reserved, unknown)",
        ["tenant", "provider", "state"],
        [
            (slug, p.provider, state, value)
            for slug, r in reports.items()
            for p in r.providers
            for state, value in (
                ("settled", p.settled_cents),
                ("reserved", p.reserved_cents),
                ("unknown", p.unknown_cents),
            )
        ],
    )
    yield gauge(
        "fenceline_unknown_reserved_cents",
        "Cents held by the tenant's UNKNOWN cost reservations (whenever made), until reconciled",
        ["tenant"],
        [(slug, r.unknown_reserved_cents) for slug, r in reports.items()],
    )
    yield gauge(
        "fenceline_retry_cost_cents",
        f"Cents settled or still held by attempts 2 and later, dispatched {window}",
        ["tenant"],
        [(slug, r.retry_cents) for slug, r in reports.items()],
    )
    yield gauge(
        "fenceline_reserved_dispatches",
        f"Dispatches that reserved cost {window} (the fallback rate's denominator)",
        ["tenant"],
        [(slug, r.dispatches) for slug, r in reports.items()],
    )
    yield gauge(
        "fenceline_fallback_dispatches",
        f"Of those, dispatches whose worker reported fallback_used: true {window}",
        ["tenant"],
        [(slug, r.fallback_dispatches) for slug, r in reports.items()],
    )
    yield gauge(
        "fenceline_fallback_rate",
        f"fallback_dispatches / reserved_dispatches {window}",
        ["tenant"],
        [(slug, r.fallback_rate) for slug, r in reports.items() if r.fallback_rate is not None],
    )
    yield gauge(
        "fenceline_denials",
        f"Operations DENIED {window}, by decision code (DENY_BUDGET, DENY_POLICY, ...)",
        ["tenant", "reason"],
        [(slug, code, n) for slug, r in reports.items() for code, n in r.denials.items()],
    )


class DatabaseMetrics(DatabaseCollector):
    """The ledger's families."""

    families = (
        breakers,
        stale_writes,
        run_totals,
        leases_and_instances,
        stuck_runs,
        cost_windows,
        flow_in_flight,
        levers,
        credential_leases,
        resources,
        workers,
        jobs,
    )
