"""Backups that say what they hold, and the check of a restored database.

``backup_manifest_record`` writes, just before a dump is taken (``manage.py backup``), a
``BackupManifest`` row into the database itself, so the manifest travels inside the backup
and cannot be separated from it: the migrations applied, the schema versions of every
record kind (how many rows at each), the phase of every schema change and the state of
every backfill.

``restore_check`` is what a person runs on a restored database before any worker may act:
it compares the database with its newest manifest and with this build (migrations this
build has that the database lacks, records of versions this build cannot read, a record
kind at several versions and the change that explains it, a contracted change with records
still at the old version), verifies every run's chain, and holds effects on every tenant it
checked: workers are admitted read-only (leases, renewals, events and intents; no authorize
or dispatch: 409 EFFECTS_HELD) until a person allows effects (``effects_allow``)."""

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder
from django.db.models import Count
from django.utils import timezone

from ledger.errors import NotFound
from ledger.models import Backfill, BackupManifest, Run, SchemaChange, Tenant
from ledger.roles import ADMINISTER
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.evidence.checkpoint_store import rollback_check
from ledger.services.evidence.verification import ledger_verify
from ledger.states import UpgradePhase
from ledger.versioning import Versioned, known_for

VERIFY_CHUNK = 500


def _versions() -> dict[str, dict[str, int]]:
    """How many rows of each versioned record kind are at each schema version."""
    found = {}
    for model in apps.get_models():
        if issubclass(model, Versioned):
            rows = model._default_manager.values_list("schema_version").annotate(n=Count("pk")).order_by()
            counts = {str(version): n for version, n in rows}
            if counts:
                found[model._meta.label] = counts
    return found


def _migrations() -> dict[str, list[str]]:
    applied: dict[str, list[str]] = {}
    for app, name in MigrationRecorder(connection).applied_migrations():
        applied.setdefault(app, []).append(name)
    return {app: sorted(names) for app, names in sorted(applied.items())}


def manifest_now() -> dict[str, Any]:
    return {
        "migrations": _migrations(),
        "schema_versions": _versions(),
        "changes": {
            c.name: {"phase": c.phase, "from_version": c.from_version, "to_version": c.to_version}
            for c in SchemaChange.objects.order_by("name")
        },
        "backfills": {
            b.name: {"state": b.state, "last_key": b.last_key, "scanned": b.scanned, "changed": b.changed}
            for b in Backfill.objects.order_by("name")
        },
        "runs": Run.objects.count(),
    }


def backup_manifest_record(*, by: str, label: str = "") -> BackupManifest:
    """The manifest of the database as it is now, stored in it (take the dump right after)."""
    return BackupManifest.objects.create(
        taken_at=timezone.now(), taken_by=by[:150], label=label[:200], manifest=manifest_now()
    )


@dataclass
class RestoreReport:
    manifest_taken_at: str = ""
    problems: list[str] = field(default_factory=list)  # must be fixed before effects are allowed
    notes: list[str] = field(default_factory=list)  # worth knowing; nothing to fix
    mixed: dict[str, dict[str, int]] = field(default_factory=dict)
    runs_verified: int = 0
    events_verified: int = 0
    broken_runs: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)  # runs behind the checkpoints kept outside
    held_tenants: list[str] = field(default_factory=list)
    pending_migrations: list[str] = field(default_factory=list)  # the check stopped before them

    @property
    def ok(self) -> bool:
        return not self.problems


def _unapplied() -> list[str]:
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{m.app_label}.{m.name}" for m, backwards in plan if not backwards]


def restore_check(
    *, by: str, tenants: list[str] | None = None, hold: bool = True, progress: Callable[[int, int], None] | None = None
) -> RestoreReport:
    """Check a restored database (see the module); hold effects on the tenants checked."""
    report = RestoreReport()
    _compare_manifest(report)
    pending = report.pending_migrations = _unapplied()
    if pending:
        report.problems.append(
            f"this build has migrations the database lacks (run manage.py migrate): {', '.join(pending)}"
        )
        return report  # nothing below can be read reliably before then
    _compare_versions(report)
    _verify_chains(report, progress)
    _check_rollbacks(report)
    if report.broken_runs:
        report.problems.append(f"{len(report.broken_runs)} run chains are BROKEN (see the runs list, integrity BROKEN)")
    if hold:
        report.held_tenants = effects_hold(
            by=by, tenants=tenants, reason=f"restored database checked by {by}; a person allows effects"
        )
    return report


def _compare_manifest(report: RestoreReport) -> None:
    """The newest backup manifest against the database: a missing manifest, or migrations
    it records that the database lacks, are problems."""
    manifest = BackupManifest.objects.order_by("-taken_at").first()
    if manifest is None:
        report.problems.append(
            "no backup manifest in this database: it was not taken with manage.py backup, so what it holds is unknown"
        )
        return
    report.manifest_taken_at = manifest.taken_at.isoformat()
    recorded = manifest.manifest.get("migrations", {})
    now = _migrations()
    missing = sorted(
        f"{app}.{name}" for app, names in recorded.items() for name in names if name not in now.get(app, [])
    )
    if missing:
        report.problems.append(f"migrations in the manifest but not in this database: {', '.join(missing)}")


def _compare_versions(report: RestoreReport) -> None:
    """The records' schema versions against this build: versions it cannot read are
    problems; a kind at several versions is noted, with the change that explains it (a
    problem once that change is contracted with records still at version 1)."""
    versions = _versions()
    phases = dict(SchemaChange.objects.values_list("name", "phase"))
    for label, counts in versions.items():
        unknown = sorted(int(v) for v in counts if int(v) not in known_for(label))
        if unknown:
            report.problems.append(
                f"{label}: {sum(counts[str(v)] for v in unknown)} records at schema_version "
                f"{', '.join(map(str, unknown))}, which this build cannot read (a newer build wrote them)"
            )
        if len(counts) > 1:
            report.mixed[label] = counts
    if "ledger.Operation" in report.mixed:
        where = phases.get("operation.provider_ref", UpgradePhase.EXPAND)
        counts = report.mixed["ledger.Operation"]
        line = f"ledger.Operation at mixed versions {counts} (operation.provider_ref in {where})"
        if where == UpgradePhase.CONTRACT and counts.get("1"):
            report.problems.append(f"{line}: contracted, yet records are at version 1 — run the backfill first")
        else:
            report.notes.append(f"{line}: readable; the backfill moves the rest (manage.py backfill)")


def _verify_chains(report: RestoreReport, progress: Callable[[int, int], None] | None) -> None:
    """Verify every run's chain, ``VERIFY_CHUNK`` runs at a time."""
    runs = Run.objects.order_by("pk").values_list("pk", flat=True)
    total = runs.count()
    chunk: list[uuid.UUID] = []
    for run_id in runs.iterator(chunk_size=VERIFY_CHUNK):
        chunk.append(run_id)
        if len(chunk) == VERIFY_CHUNK:
            _verify(chunk, report)
            chunk = []
            if progress:
                progress(report.runs_verified, total)
    if chunk:
        _verify(chunk, report)
    if progress:
        progress(report.runs_verified, total)


def _check_rollbacks(report: RestoreReport) -> None:
    """Every run against the last checkpoint kept outside the database
    (``FENCELINE["EXTERNAL_CHECKPOINTS"]``): each ROLLED_BACK run is a problem of its own,
    named with the seq the store knows, and not counted again among the BROKEN."""
    for found in rollback_check():
        report.rolled_back.append(found.run_id)
        report.problems.append(f"run {found.run_id} ROLLED_BACK at seq {found.seq}: {found.detail}")
    report.broken_runs = [run_id for run_id in report.broken_runs if run_id not in report.rolled_back]


def _verify(run_ids: list[uuid.UUID], report: RestoreReport) -> None:
    result = ledger_verify(run_ids=run_ids)
    report.runs_verified += result.runs
    report.events_verified += result.events
    if result.broken:
        broken = Run.objects.filter(pk__in=run_ids).exclude(broken_reason="").values_list("pk", flat=True)
        report.broken_runs += [str(run_id) for run_id in broken]


def effects_hold(*, by: str, tenants: list[str] | None, reason: str) -> list[str]:
    """Admit the workers of ``tenants`` (all when None) read-only: no authorize or dispatch."""
    chosen = Tenant.objects.all() if tenants is None else Tenant.objects.filter(slug__in=tenants)
    held: list[str] = []
    with transaction.atomic():
        for tenant in chosen.order_by("slug"):
            Tenant.objects.filter(pk=tenant.pk).update(effects_held=True, effects_held_reason=reason[:500])
            admin_action_record(
                tenant=tenant, actor=by, action="tenant.effects_hold", subject=tenant.slug, reason=reason
            )
            held.append(tenant.slug)
    return held


def effects_allow(*, tenant: str, reason: object, user: User | AnonymousUser | None = None, name: str = "") -> Tenant:
    """A person allows the tenant's workers to act again after a restore, with a reason:
    a console ``user`` needs the admin role on the tenant; a command names the person."""
    why = decision_reason(reason)
    found = Tenant.objects.filter(slug=tenant).first()
    if found is None:
        raise NotFound(f"there is no tenant {tenant!r}")
    by = acting_name(user=user, name=name, tenant_id=found.pk, perm=ADMINISTER)
    with transaction.atomic():
        Tenant.objects.filter(pk=found.pk).update(effects_held=False, effects_held_reason="")
        admin_action_record(tenant=found, actor=by, action="tenant.effects_allow", subject=found.slug, reason=why)
    found.refresh_from_db()
    return found
