"""Prometheus metrics at ``/metrics`` (docs/operations.md lists each with an alert rule).

Two sources, so that every replica answers the same and nothing is lost when a process dies:

- **The database, read at scrape time**, for everything it already holds: UNKNOWN outcomes,
  reconciliations by source, stale-token rejections, events accepted, verification, breakers,
  cost windows, credential leases, instances, resources, drains, restarts and the periodic
  jobs' heartbeats. Bounded aggregates over indexed columns, labelled by tenant. What the
  runs add up to takes a pass over every run: the count-run-totals job keeps it
  (``ledger/observability/totals.py``), and a scrape counts it only when the job is not
  fresh. The families are small functions (``ledger/observability/database.py``); the
  approvals app registers its own collector beside the ledger's (``approvals/metrics.py``).
- **Process counters** (prometheus_client) for what the database does not keep: request
  latency per endpoint, lease acquisitions and renewals, duplicate rejections, retries by
  effect class. With ``PROMETHEUS_MULTIPROC_DIR`` set (gunicorn with several workers, the
  compose file), every process of the host writes its values there and a scrape sums them.

Labels stay bounded: tenant, job, state, kind, effect class, route, method, status code —
never a run, operation or worker id. A scrape without the right to see tenants
(``scrape(per_tenant=False)``) gets each family folded over the ``tenant`` label: summed, and
for the ages (a gauge named ``..._seconds`` or ``..._age_...``) the oldest.
"""

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ledger.observability.database import DatabaseMetrics

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
THROTTLED = Counter(
    "fenceline_throttled_requests",
    "Requests answered 429 by a throttle: console_login (django-axes, per user and per address) "
    "or worker_token (failed worker tokens per address)",
    ["kind"],
)
FLOW_THROTTLED = Counter(
    "fenceline_flow_throttled",
    "Dispatches refused 409 THROTTLED by the policy's flow control, by the refusing key's kind "
    "(tenant, tool, provider, key) and limit (concurrency or rate)",
    ["tenant", "kind", "limit"],
)
REQUEST_SECONDS = Histogram(
    "fenceline_http_request_duration_seconds",
    "Server time per request, by route pattern (never the path itself), method and status code",
    ["route", "method", "code"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

# The database's collectors, by name: the ledger's, and those the apps above it register at
# start-up (approvals.apps: the cases and approval requests).
_collectors: dict[str, Collector] = {"ledger": DatabaseMetrics()}


def register(name: str, collector: Collector) -> None:
    """Add a collector that reads the database at scrape time (again under a name: replaced)."""
    _collectors[name] = collector


class _ThisProcess(Collector):
    """The process counters of this process (when there is no multiprocess directory)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def _fold(family: Metric, sample_name: str, a: float, b: float) -> float:
    """Two tenants' values of one series as one: the first creation time, the oldest age,
    else the sum."""
    if sample_name.endswith("_created"):
        return min(a, b)
    if family.type == "gauge" and ("seconds" in family.name or "_age_" in family.name):
        return max(a, b)
    return a + b


def _folded(family: Metric) -> Metric:
    """``family`` with its ``tenant`` label folded away (summed; an age: the largest)."""
    if not any("tenant" in sample.labels for sample in family.samples):
        return family
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in family.samples:
        key = (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "tenant")))
        values[key] = _fold(family, sample.name, values[key], sample.value) if key in values else sample.value
    folded = Metric(family.name, family.documentation, family.type, family.unit)
    for (name, labels), value in values.items():
        folded.add_sample(name, dict(labels), value)
    return folded


class _TenantTotals(Collector):
    """A registry's families with every per-tenant series folded into totals."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            yield _folded(family)


def scrape(*, per_tenant: bool = True) -> bytes:
    """The text exposition of every metric: the database's and the processes'; without
    ``per_tenant``, totals over the tenants (no tenant's slug in it)."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    else:
        registry.register(_ThisProcess())
    for collector in _collectors.values():
        registry.register(collector)
    return generate_latest(registry if per_tenant else _TenantTotals(registry))


# Counts made in a transaction that may be rolled back whole and run again (the one effect
# call's first pass, ``ledger.services.core.fencing.one_transaction``): held until the caller
# knows the pass stands, so a refusal met in both passes is counted once.
_HELD: ContextVar[list[Callable[[], None]] | None] = ContextVar("held_counts", default=None)


def count(inc: Callable[[], None]) -> None:
    """``inc()`` now, or once the pass holding counts (:func:`counts_held`) is known to stand."""
    held = _HELD.get()
    if held is None:
        inc()
    else:
        held.append(inc)


@contextmanager
def counts_held() -> Iterator[list[Callable[[], None]]]:
    """The counts made inside, held: the caller makes them (each ``inc()``) when the pass stands."""
    held: list[Callable[[], None]] = []
    token = _HELD.set(held)
    try:
        yield held
    finally:
        _HELD.reset(token)
