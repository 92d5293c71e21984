"""Boot reports, readiness and restart episodes (article "Your Agent Restart Loop Needs a
Budget"): each start of a worker process reports what it runs and whether each domain is
ready; a failed domain stops admission (lease acquisition: 409 NOT_READY, or
CREDENTIALS_NOT_READY), not the process. Boots that follow each other after a crash, or
without ever reaching EXECUTING, form a restart episode: each boot is answered with the delay
to wait, min(300, 2^n) s, and past the policy's ``restart_budget`` (5 restarts in 600 s) the
worker is QUARANTINED with its boots kept as the diagnostic bundle, until a person resumes it.

The rest of the article's failure matrix: a boot that failed a state migration is
QUARANTINED at once (rollback or repair is a person's decision, not another restart); a
ready boot of a worker that left effects in doubt is READY with admission paused (409
RECONCILE_FIRST, ``core/admission.py``) until they are decided; and a tenant whose policy
sets ``runtime_audit`` refuses admission (the ``admission`` domain fails) to a boot whose
container self-audit shows root, extra capabilities, host-control paths, sensitive mounts,
a writable root filesystem, no no-new-privileges or writable mounts outside the declared
output paths (as its rules ask). Under ``admission.boot_report_required`` a worker that sent
no boot report at all is not admitted either (``core/admission.py``).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.boundary import check_text
from ledger.errors import BootIdReused, CredentialsNotReady, InvalidInput, NotReady, ReconcileFirst
from ledger.models import Worker, WorkerBoot
from ledger.policy import runtime_audit_failures
from ledger.services.authority.policy import policy_current
from ledger.services.core.admission import operations_in_doubt
from ledger.services.core.decisions import admin_action_record
from ledger.services.evidence.append import checked_document
from ledger.services.fleet.lifecycle import QUARANTINE_FROM, worker_quarantine_by_system, worker_stopped
from ledger.services.upgrades.phases import written_versions
from ledger.states import WorkerStatus

DOMAINS = ("runtime", "state", "credentials", "outbound_delivery", "admission")
MAX_DELAY_S = 300
MAX_EVIDENCE_BYTES = 4096
SYSTEM_RESTART_BUDGET = "system:restart-budget"
SYSTEM_STATE_MIGRATION = "system:state-migration"
ERROR_KINDS = ("config", "migration", "credentials", "dependency", "crash")
MAX_ERROR_MESSAGE = 500


@dataclass(frozen=True)
class BootReport:
    boot_id: str
    config_hash: str
    code_version: str
    state_schema_version: int
    pid: int
    host: str
    readiness: dict[str, Any]
    credential_version: int | None = None
    # The error this process failed with while starting: {kind, message, at}.
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class BootAnswer:
    boot: WorkerBoot
    delay_s: int
    quarantined: bool
    replayed: bool = False  # the same report again (a retry after a lost answer)


def _text(value: object, name: str, limit: int) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= limit:
        raise InvalidInput(f"{name} must be 1 to {limit} characters", field=name)
    check_text(value, path=name)
    return value


# A boot's readiness as kept: {domain: {ok, evidence}}, every domain of DOMAINS.
type Readiness = dict[str, dict[str, Any]]


def _readiness(readiness: object) -> tuple[Readiness, list[str]]:
    if not isinstance(readiness, dict) or set(readiness) != set(DOMAINS):
        raise InvalidInput(f"readiness must name exactly {', '.join(DOMAINS)}", field="readiness")
    checked: Readiness = {}
    failed: list[str] = []
    for domain in DOMAINS:
        entry = readiness[domain]
        if not isinstance(entry, dict) or not isinstance(entry.get("ok"), bool) or set(entry) - {"ok", "evidence"}:
            raise InvalidInput("each domain is {ok: true|false, evidence: {...}}", field=f"readiness.{domain}")
        evidence = checked_document(
            entry.get("evidence", {}), field=f"readiness.{domain}.evidence", max_bytes=MAX_EVIDENCE_BYTES
        )
        checked[domain] = {"ok": entry["ok"], "evidence": evidence}
        if not entry["ok"]:
            failed.append(domain)
    return checked, failed


def _error(error: object, readiness: Readiness) -> dict[str, str] | None:
    if error is None:
        return None
    if not isinstance(error, dict) or set(error) != {"kind", "message", "at"}:
        raise InvalidInput("error must be {kind, message, at}", field="error")
    if error["kind"] not in ERROR_KINDS:
        raise InvalidInput(f"error.kind must be one of {', '.join(ERROR_KINDS)}", field="error.kind")
    message = _text(error["message"], "error.message", MAX_ERROR_MESSAGE)
    if error["kind"] == "migration" and readiness["state"]["ok"]:
        raise InvalidInput("a migration error leaves the state domain not ready", field="error.kind")
    try:
        at = datetime.fromisoformat(error["at"]) if isinstance(error["at"], str) else error["at"]
    except ValueError:
        at = None
    if not isinstance(at, datetime) or at.tzinfo is None:
        raise InvalidInput("error.at must be an ISO 8601 date-time with its offset", field="error.at")
    return {"kind": error["kind"], "message": message, "at": at.isoformat()}


def _audited(readiness: Readiness, failed: list[str], policy: dict[str, Any]) -> None:
    """Fail the admission domain of a boot whose container self-audit the policy refuses."""
    refused = runtime_audit_failures(policy.get("runtime_audit"), readiness["runtime"]["evidence"].get("audit"))
    if not refused:
        return
    admission = readiness["admission"]
    admission["ok"] = False
    admission["evidence"] = {**admission["evidence"], "refused_by_policy": refused}
    if "admission" not in failed:
        failed.append("admission")


def _reads_records(readiness: Readiness, failed: list[str], reads_up_to: int) -> None:
    """Fail the state domain of a boot whose build cannot read the records as they are now
    written: a schema change in MIGRATE or CONTRACT writes its new version (the old build
    would refuse those records; it is not admitted to meet them)."""

    needs = [(name, version) for name, version in written_versions() if version > reads_up_to]
    if not needs:
        return
    state = readiness["state"]
    state["ok"] = False
    state["evidence"] = {
        **state["evidence"],
        "refused_by_server": f"this build reads schema_version up to {reads_up_to}; records are written at "
        + ", ".join(f"{version} ({name})" for name, version in needs),
    }
    if "state" not in failed:
        failed.append("state")


def not_ready_code(failed: list[str], *, in_doubt: int = 0) -> str:
    if not failed:
        return ReconcileFirst.code if in_doubt else ""
    return CredentialsNotReady.code if failed == ["credentials"] else NotReady.code


@dataclass(frozen=True)
class _Checked:
    """A boot report's texts, readiness and error as they are kept (each checked)."""

    boot_id: str
    config_hash: str
    code_version: str
    host: str
    readiness: Readiness
    failed: list[str]  # the domains not ready
    error: dict[str, str] | None


def _checked(report: BootReport) -> _Checked:
    """The report's texts, readiness and error, each checked (InvalidInput naming the first
    field refused)."""
    boot_id = _text(report.boot_id, "boot_id", 64)
    config_hash = _text(report.config_hash, "config_hash", 100)
    code_version = _text(report.code_version, "code_version", 100)
    host = _text(report.host, "host", 200)
    readiness, failed = _readiness(report.readiness)
    error = _error(report.error, readiness)
    return _Checked(boot_id, config_hash, code_version, host, readiness, failed, error)


def worker_boot(*, worker: Worker, report: BootReport) -> BootAnswer:
    """Record a boot, tell the previous one how it ended, and answer with the restart delay;
    quarantine the worker once its episode passes the restart budget."""
    checked = _checked(report)
    _, policy = policy_current(tenant=worker.tenant)
    _audited(checked.readiness, checked.failed, policy)
    _reads_records(checked.readiness, checked.failed, report.state_schema_version)
    budget = policy.get("restart_budget", {"max_restarts": 5, "window_s": 600})
    with transaction.atomic():
        locked = Worker.objects.select_for_update().get(pk=worker.pk)
        now = timezone.now()
        same = WorkerBoot.objects.filter(worker=locked, boot_id=checked.boot_id).first()
        if same is not None:
            return _replayed(
                same, locked, config_hash=checked.config_hash, code_version=checked.code_version, report=report
            )
        place = _place_in_episode(locked, now=now, window_s=budget["window_s"])
        restarts = place - 1
        delay = 0 if restarts == 0 else min(MAX_DELAY_S, 2**restarts)
        in_doubt = operations_in_doubt(locked).count()
        boot = _boot_record(locked, checked, report, now=now, place=place, delay=delay, in_doubt=in_doubt)
        _worker_up(locked, now=now, phase=boot.phase, not_ready=not_ready_code(checked.failed, in_doubt=in_doubt))
        actor, reason = _quarantine_cause(locked, checked.error, restarts=restarts, budget=budget)
        if reason:
            quarantine_with_bundle(locked, actor=actor, reason=reason, boots=place, now=now)
    quarantined = bool(reason)
    worker.refresh_from_db()
    return BootAnswer(boot=boot, delay_s=delay, quarantined=quarantined)


def _place_in_episode(worker: Worker, *, now: datetime, window_s: int) -> int:
    """Mark how the worker's previous boot ended (a clean exit, else a crash) and return
    this boot's place in its restart episode: a boot after a crash within ``window_s``
    continues the episode; a clean exit ends it."""
    previous = WorkerBoot.objects.filter(worker=worker).order_by("-reported_at").first()
    if previous is None:
        return 1
    if not previous.ended:
        clean = worker.status in (WorkerStatus.STOPPED, WorkerStatus.QUIESCED)
        previous.ended = "exit" if clean else "crash"
        WorkerBoot.objects.filter(pk=previous.pk).update(ended=previous.ended)
    in_episode = previous.ended == "crash"
    recent = previous.reported_at >= now - timedelta(seconds=window_s)
    return previous.episode_boot + 1 if in_episode and recent else 1


def _boot_record(
    worker: Worker, checked: _Checked, report: BootReport, *, now: datetime, place: int, delay: int, in_doubt: int
) -> WorkerBoot:
    """The WorkerBoot row: READY when every domain is, else PROCESS_UP."""
    try:
        with transaction.atomic():
            return WorkerBoot.objects.create(
                worker=worker,
                tenant_id=worker.tenant_id,
                boot_id=checked.boot_id,
                reported_at=now,
                config_hash=checked.config_hash,
                code_version=checked.code_version,
                state_schema_version=report.state_schema_version,
                credential_version=report.credential_version,
                pid=report.pid,
                host=checked.host,
                readiness=checked.readiness,
                failed_domains=checked.failed,
                phase="READY" if not checked.failed else "PROCESS_UP",
                episode_boot=place,
                delay_s=delay,
                error=checked.error,
                unknown_left=in_doubt,
            )
    except IntegrityError:  # not reachable under the worker's row lock; kept as the last word
        raise BootIdReused("boot_id was reported already") from None


def _worker_up(worker: Worker, *, now: datetime, phase: str, not_ready: str) -> None:
    """The worker row after a boot: its phase and readiness, seen now; a QUIESCED worker
    is STOPPED (the drained process is gone), and a STOPPED one accepts work again."""
    started: dict[str, Any] = {}
    if worker.status == WorkerStatus.QUIESCED:  # the drained process is gone: a new one booted
        worker_stopped(worker, now, reason="a new process booted after the drain")
    if worker.status == WorkerStatus.STOPPED:  # a new process after a clean stop accepts work again
        started = {
            "status": WorkerStatus.ACCEPTING,
            "status_changed_at": now,
            "status_changed_by": "system:boot",
            "status_reason": "a new process booted",
            "drain_deadline": None,
        }
    Worker.objects.filter(pk=worker.pk).update(
        boot_phase=phase,
        not_ready_code=not_ready,
        last_heartbeat_at=now,
        last_seen_at=now,
        **started,
    )


def _quarantine_cause(
    worker: Worker, error: dict[str, str] | None, *, restarts: int, budget: dict[str, int]
) -> tuple[str, str]:
    """(actor, reason) of the quarantine this boot calls for: a failed state migration, or
    an episode past the restart budget; ("", "") for none, or for a worker whose status
    cannot go to QUARANTINED."""
    if worker.status not in QUARANTINE_FROM:
        return "", ""
    if error is not None and error["kind"] == "migration":
        return SYSTEM_STATE_MIGRATION, f"state migration failed: {error['message']}"
    if restarts > budget["max_restarts"]:
        return SYSTEM_RESTART_BUDGET, f"restart budget exceeded: {restarts} restarts within {budget['window_s']} s"
    return "", ""


def _replayed(
    boot: WorkerBoot, worker: Worker, *, config_hash: str, code_version: str, report: BootReport
) -> BootAnswer:
    """The answer to a boot report sent again under its boot_id: the first answer when the
    report is the same, 409 BOOT_ID_REUSED when it is not."""
    if (boot.config_hash, boot.code_version, boot.pid) != (config_hash, code_version, report.pid):
        raise BootIdReused("boot_id was reported already by another process or configuration")
    quarantined = worker.status == WorkerStatus.QUARANTINED
    return BootAnswer(boot=boot, delay_s=boot.delay_s, quarantined=quarantined, replayed=True)


def quarantine_with_bundle(
    worker: Worker, *, actor: str, reason: str, boots: int = 1, now: datetime, evidence: dict[str, Any] | None = None
) -> None:
    """QUARANTINE the worker (a system decision a person must undo) and retain the
    diagnostic bundle with the decision: its last ``boots`` boots (errors, readiness,
    config hashes, how each ended, what each left in doubt), the last good config hash and
    the caller's ``evidence``."""
    worker_quarantine_by_system(worker=worker, actor=actor, reason=reason, now=now)
    recent = list(WorkerBoot.objects.filter(worker=worker).order_by("-reported_at")[: max(boots, 1)])
    good = WorkerBoot.objects.filter(worker=worker, phase="EXECUTING").order_by("-reported_at").first()
    admin_action_record(
        tenant=worker.tenant,
        actor=actor,
        action="worker.quarantine",
        subject=worker.name,
        reason=reason,
        fields={
            "diagnostic_bundle": {
                "boots": [
                    {
                        "boot_id": b.boot_id,
                        "reported_at": b.reported_at.isoformat(),
                        "config_hash": b.config_hash,
                        "code_version": b.code_version,
                        "state_schema_version": b.state_schema_version,
                        "failed_domains": b.failed_domains,
                        "readiness": b.readiness,
                        "error": b.error,
                        "unknown_left": b.unknown_left,
                        "ended": b.ended,
                    }
                    for b in recent
                ],
                "last_good_config_hash": good.config_hash if good else None,
                **(evidence or {}),
            }
        },
        now=now,
    )
