"""Health and readiness of the control plane, and what counts as the database being away.

``/healthz`` says only that the process answers. ``/readyz`` checks each domain and names the
one that fails, with a reason that carries nothing secret (no URL, no host, no exception
message). Domains that stop the API (``SERVING``) fail it; domains that only delay background
work (``BACKGROUND``) are reported as degraded, and ``/readyz/jobs`` fails on them:

- ``database``: reachable, and every migration applied;
- ``evidence_keys``: the checkpoint and event MAC keys are configured and the signing ids among them;
- ``schema``: no stored record carries a schema_version this build cannot read (checked at
  most every ``READYZ_SCHEMA_CHECK_S`` per process: it reads every versioned table);
- ``fence``: this database is the fence's home, not a restored image that
  ``manage.py restore_check`` has not run on yet (every fenced call answers 503
  RESTORE_UNCHECKED there);
- ``replication`` (background, only with ``FENCELINE_HA=1``): the primary has a synchronous
  standby configured and streaming, without which a failover can lose acknowledged grants and
  hand a fencing token out twice (docs/production.md "High availability");
- ``broker`` (background): Celery's broker accepts a connection;
- ``jobs`` (background): every periodic job of the beat schedule finished within
  ``JOB_STALE_AFTER_INTERVALS`` of its interval (its heartbeat, ledger/models/jobs.py).
"""

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from celery import current_app
from django.apps import apps
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from ledger.models import JobHeartbeat
from ledger.sql import fence as sql_fence
from ledger.sql import reads as sql_reads
from ledger.versioning import Versioned, known_for

# SQLSTATEs of a server that is not there to answer: class 08 (connection exception), an
# administrator's or a crash's shutdown, a server starting up or shutting down, no free slot.
_AWAY_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def database_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached (connection refused or lost, the
    server restarting or shut down), as opposed to a statement that failed on a live server
    (a timeout, a constraint, a serialization failure: not an outage)."""
    if not isinstance(exc, (OperationalError, InterfaceError)):
        return False
    cause = exc.__cause__
    if isinstance(cause, psycopg.InterfaceError):
        return True  # the connection is closed
    if isinstance(cause, psycopg.OperationalError):
        state = cause.sqlstate
        return state is None or state.startswith("08") or state in _AWAY_STATES
    return isinstance(exc, InterfaceError)  # Django's own "connection already closed"


@dataclass
class Check:
    domain: str
    ok: bool
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def check_database() -> Check:
    try:
        sql_reads.ping()
        loader = MigrationLoader(connection)
        # Every migration of the code that the database has not recorded, wherever it sits
        # in the graph (a plan towards the leaves would skip one whose child is applied).
        pending = sorted(set(loader.graph.nodes) - set(loader.applied_migrations or {}))
    except DatabaseError as exc:
        return Check("database", False, f"not reachable ({type(exc).__name__})")
    if pending:
        names = [f"{app}.{name}" for app, name in pending]
        return Check("database", False, f"{len(names)} migration(s) not applied", {"pending": names[:20]})
    return Check("database", True)


def check_replication() -> Check:
    """With ``FENCELINE["HA"]``: a synchronous standby is configured and streaming to the primary."""
    try:
        names, streaming = sql_reads.synchronous_standbys()
    except DatabaseError as exc:
        return Check("replication", False, f"not checked ({type(exc).__name__})")
    if not names.strip():
        return Check("replication", False, "no synchronous standby configured (synchronous_standby_names is empty)")
    if streaming == 0:
        return Check("replication", False, "no synchronous standby streaming to the primary", {"configured": names})
    return Check("replication", True, detail={"synchronous_standbys": streaming})


def check_broker(timeout_s: float = 2.0) -> Check:
    """The broker of the process's Celery app (``console/celery.py``, current once the project's
    package is imported) accepts a connection."""
    try:
        with current_app.connection_for_write(settings.CELERY_BROKER_URL) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, interval_max=0, timeout=timeout_s)
    except Exception as exc:  # kombu raises the transport's own errors
        return Check("broker", False, f"not reachable ({type(exc).__name__})")
    return Check("broker", True)


@dataclass
class JobFreshness:
    name: str
    interval_s: float
    allowed_s: float
    fresh: bool
    reason: str
    beat: JobHeartbeat | None


def job_allowed_s(name: str) -> float:
    """How long the beat job ``name`` may go without finishing and still be fresh:
    ``JOB_STALE_AFTER_INTERVALS`` of its interval plus ``JOB_STALE_GRACE_S``."""
    interval = float(settings.CELERY_BEAT_SCHEDULE[name]["schedule"])
    intervals: int = settings.FENCELINE["JOB_STALE_AFTER_INTERVALS"]
    grace_s: int = settings.FENCELINE["JOB_STALE_GRACE_S"]
    return interval * intervals + grace_s


def _failing_since_success(beat: JobHeartbeat) -> bool:
    if beat.last_failed_at is None or not beat.last_error:
        return False
    return beat.last_finished_at is None or beat.last_failed_at > beat.last_finished_at


def jobs_freshness() -> list[JobFreshness]:
    """Each beat job: fresh or not, and why (also the dashboard's "Background jobs")."""
    now = timezone.now()
    beats = {b.name: b for b in JobHeartbeat.objects.all()}
    rows = []
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        interval = float(entry["schedule"])
        allowed = job_allowed_s(name)
        beat = beats.get(name)
        reason = ""
        if beat is None or beat.last_finished_at is None:
            reason = "never finished"
        elif (age := (now - beat.last_finished_at).total_seconds()) > allowed:
            reason = f"last finished {age:.0f} s ago (allowed {allowed:.0f} s)"
        if reason and beat is not None and _failing_since_success(beat):
            reason += f", failing with {beat.last_error}"
        rows.append(JobFreshness(name, interval, allowed, not reason, reason, beat))
    return rows


def check_jobs() -> Check:
    try:
        rows = jobs_freshness()
    except DatabaseError as exc:
        return Check("jobs", False, f"heartbeats not readable ({type(exc).__name__})")
    stale = {row.name: row.reason for row in rows if not row.fresh}
    if stale:
        return Check("jobs", False, f"{len(stale)} periodic job(s) not fresh: {', '.join(sorted(stale))}", stale)
    return Check("jobs", True)


def check_evidence_keys() -> Check:
    conf = settings.FENCELINE
    for keys, signing, what in (
        ("CHECKPOINT_KEYS", "CHECKPOINT_SIGNING_KEY_ID", "checkpoint"),
        ("EVENT_KEYS", "EVENT_SIGNING_KEY_ID", "event"),
    ):
        if not conf.get(keys) or conf.get(signing) not in conf[keys]:
            return Check("evidence_keys", False, f"the {what} MAC keys or their signing key id are missing")
    return Check("evidence_keys", True)


@dataclass
class _SchemaCache:
    """This process's last schema check and when it ran (time.monotonic())."""

    at: float = 0.0
    result: Check | None = None


_schema_cache = _SchemaCache()


def check_schema() -> Check:
    """Stored records with a schema_version this build does not know (cached per process)."""
    every = settings.FENCELINE["READYZ_SCHEMA_CHECK_S"]
    if _schema_cache.result is not None and time.monotonic() - _schema_cache.at < every:
        return _schema_cache.result
    unknown = []
    try:
        for model in apps.get_models():
            if issubclass(model, Versioned):
                with transaction.atomic():
                    if model._default_manager.exclude(schema_version__in=known_for(model._meta.label)).exists():
                        unknown.append(model._meta.label)
    except DatabaseError as exc:
        return Check("schema", False, f"not checked ({type(exc).__name__})")
    result = (
        Check("schema", False, f"records of an unknown schema version in {', '.join(unknown)}", {"tables": unknown})
        if unknown
        else Check("schema", True)
    )
    _schema_cache.at, _schema_cache.result = time.monotonic(), result
    return result


# Without these the API cannot answer (``/readyz`` fails); without those the API answers but an
# operator is needed: background work waits, or the next failover could undo the fence
# (``/readyz`` reports them degraded, ``/readyz/jobs`` fails).
SERVING = ("database", "evidence_keys", "schema", "fence")
BACKGROUND = ("broker", "jobs", "replication")


def readiness() -> list[Check]:
    """Every domain, the serving ones first."""
    database = check_database()
    if not database.ok and database.reason.startswith("not reachable"):  # nothing else can be read
        return [database, check_evidence_keys(), Check("schema", False, "database not reachable"),
                Check("fence", False, "database not reachable"), check_broker(),
                Check("jobs", False, "database not reachable"),
                *_replication(reachable=False)]  # fmt: skip
    return [
        database,
        check_evidence_keys(),
        check_schema(),
        check_fence(),
        check_broker(),
        check_jobs(),
        *_replication(),
    ]


def check_fence() -> Check:
    """Whether this database is the fence's home or a restored image not yet checked."""
    try:
        at_home = sql_fence.fence_at_home()
    except DatabaseError as exc:
        return Check("fence", False, f"not checked ({type(exc).__name__})")
    if at_home:
        return Check("fence", True)
    return Check("fence", False, "a restored image: run manage.py restore_check before workers act")


def _replication(*, reachable: bool = True) -> list[Check]:
    """The replication check, only where ``FENCELINE_HA=1`` says the deployment is HA."""
    if not settings.FENCELINE["HA"]:
        return []
    return [check_replication() if reachable else Check("replication", False, "database not reachable")]


def background_readiness() -> list[Check]:
    """The domains that need an operator: the broker, the jobs' freshness, the synchronous standby."""
    return [check_broker(), check_jobs(), *_replication()]
