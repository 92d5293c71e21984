"""The in-app ledger verifier: streams a run's events from the database through the same
checks as the standalone verifier (``fenceline_client.evidence_verifier``), every event's MAC
under the settings' event keys included, seals checkpoints, and records the outcome on the
run for the integrity and authorization indicators.

It never holds a lock while it reads: it verifies the chain up to the head it read first
(events at or below the head have committed with it), so appends go on meanwhile.

It reads the events as rows (``event_rows``: a server-side cursor, a chunk at a time, the
columns already in the form of the canonical document) and hands them to ``verify_rows``,
which verifies the usual event without building its document: memory stays bounded by a
chunk whatever the length of the chain, and most of the time goes into the hashing.
"""

import json
import operator
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from fenceline_client.evidence_verifier import (
    PAYLOAD_VERSION,
    REMOVED_BY_RETENTION,
    ROW_COLUMNS,
    VERIFIER_VERSION,
    Finding,
    PayloadCheck,
    Report,
    checkpoint_mac,
    format_time,
    verify_rows,
)
from ledger.models import Checkpoint, Event, Run
from ledger.services.evidence.checkpoint_store import (
    ROLLED_BACK,
    ExternalCheckpoint,
    configured_store,
    rollback_of,
)
from ledger.sql import evidence as sql_evidence
from ledger.states import RUN_FINISHED
from ledger.versioning import known_for, require_known

PROGRESS_EVERY = 50_000
# Rows per FETCH from the server-side cursor: the verifier holds two such batches at a time
# (about 25 MB; docs/performance.md, issue 16's fourth session: 10,000 verified 12-23 % faster
# than 5,000 in each of three interleaved runs).
CHUNK_ROWS = 10_000
# Where a row holds what the observer looks at.
_SEQ, _TYPE, _VERSION, _FIELDS, _HASH = map(ROW_COLUMNS.index, ("seq", "type", "schema_version", "fields", "hash"))
_types, _versions = operator.itemgetter(_TYPE), operator.itemgetter(_VERSION)
_EVENT_VERSIONS = known_for("ledger.Event")
# The event types whose fields the authorization indicator follows.
_WATCHED = frozenset(
    {
        "LEASE_ACQUIRED",
        "LEASE_EXPIRED",
        "LEASE_RELEASED",
        "LEASE_REVOKED",
        "CREDENTIAL_LEASE_ISSUED",
        "CREDENTIAL_LEASE_REVOKED",
        "CREDENTIAL_ROTATED",
        "OPERATION_AUTHORIZED",
        "OPERATION_DISPATCHED",
    }
)


@dataclass
class _Observer:
    """What the verifier learns on the way through a run's events, in bounded memory."""

    seal_after: int
    every: int
    sealable: list[tuple[int, str]]
    on_events: Callable[[int], None] | None = None
    seen: int = 0
    lease_fencing_token: int | None = None
    mismatches: int = 0
    first_mismatch: str = ""
    # Credential evidence in this chain, bounded by the run's leases and operations: the
    # JSON values its events hold, taken as they are (a broken chain may hold anything).
    lease_scope: dict[object, tuple[object, object]] = field(default_factory=dict)  # lease id -> (principal, version)
    revoked: set[object] = field(default_factory=set)
    rotated_to: dict[object, object] = field(default_factory=dict)  # principal -> newest version seen
    op_lease: dict[object, object] = field(default_factory=dict)  # operation id -> lease id it was authorized with

    def see(self, rows: Sequence[Sequence[Any]]) -> None:
        """Rows (ROW_COLUMNS) as the verifier takes them in: a stored version this build does
        not know stops the verification; the seqs to seal at and the authorization evidence
        are noted."""
        if not rows:
            return
        versions = set(map(_versions, rows))
        if not versions <= _EVENT_VERSIONS or any(type(version) is not int for version in versions):
            for row in rows:  # the first row of an unknown version raises
                require_known(row[_VERSION], f"event seq {row[_SEQ]}", stored=True, known=_EVENT_VERSIONS)
        seen, self.seen = self.seen, self.seen + len(rows)
        if self.on_events is not None:
            for count in range((seen // PROGRESS_EVERY + 1) * PROGRESS_EVERY, self.seen + 1, PROGRESS_EVERY):
                self.on_events(count)
        # Seal points: the seqs in these rows that are multiples of ``every``. Sealing waits
        # for a verified chain, whose rows hold each seq once, in order; so the multiples of
        # ``every`` between the first and the last seq, found at their place.
        first, every = rows[0][_SEQ], self.every
        if type(first) is int:
            low = max(first, self.seal_after + 1)
            for seq in range(low + -low % every, first + len(rows), every):
                row = rows[seq - first]
                if row[_SEQ] == seq:
                    self.sealable.append((seq, row[_HASH]))
        if not _WATCHED.isdisjoint(map(_types, rows)):
            for row in rows:
                if row[_TYPE] in _WATCHED:
                    self._see(row[_SEQ], row[_TYPE], _fields(row[_FIELDS]))

    def _see(self, seq: int, kind: str, fields: Any) -> None:
        if kind == "LEASE_ACQUIRED":
            self.lease_fencing_token = fields.get("fencing_token")
        elif kind in ("LEASE_EXPIRED", "LEASE_RELEASED", "LEASE_REVOKED"):
            self.lease_fencing_token = None
        elif kind == "CREDENTIAL_LEASE_ISSUED":
            self.lease_scope[fields.get("lease_id")] = (fields.get("principal"), fields.get("version"))
        elif kind == "CREDENTIAL_LEASE_REVOKED":
            self.revoked.add(fields.get("lease_id"))
        elif kind == "CREDENTIAL_ROTATED":
            self.rotated_to[fields.get("principal")] = fields.get("version")
        elif kind == "OPERATION_AUTHORIZED" and fields.get("credential_lease_id"):
            self.op_lease[fields.get("operation_id")] = fields["credential_lease_id"]
        elif kind == "OPERATION_DISPATCHED":
            self._check_dispatch(seq, fields)

    def _check_dispatch(self, seq: int, fields: dict[str, Any]) -> None:
        """A dispatch disagrees with its authority when its token is not the lease's, or its
        credential lease was revoked, rotated past, or is named with another version."""
        problems = []
        if fields.get("dispatch_token") != self.lease_fencing_token:
            held = "no lease" if self.lease_fencing_token is None else f"token {self.lease_fencing_token}"
            problems.append(f"dispatched under token {fields.get('dispatch_token')} while the chain shows {held}")
        lease_id = self.op_lease.get(fields.get("operation_id"))
        if lease_id is not None:
            principal, version = self.lease_scope.get(lease_id, (None, None))
            if lease_id in self.revoked:
                problems.append(f"dispatched under credential lease {lease_id}, revoked earlier in the chain")
            if principal is not None and self.rotated_to.get(principal, version) != version:
                problems.append(
                    f"dispatched with {principal} version {version} after rotation to {self.rotated_to[principal]}"
                )
            if "credential_version" in fields and fields["credential_version"] != version:
                problems.append(
                    f"dispatch names credential version {fields['credential_version']}, lease has {version}"
                )
        if problems:
            self.mismatches += 1
            if not self.first_mismatch:
                self.first_mismatch = f"seq {seq}: " + "; ".join(problems)


def _fields(text: object) -> object:
    """The stored fields from their JSON text, as the ORM reads a JSONField."""
    if isinstance(text, str):
        with suppress(json.JSONDecodeError):
            return json.loads(text)
    return text


@contextmanager
def event_rows(*, run_id: uuid.UUID | str, upto: int) -> Iterator[Iterator[Sequence[Sequence[Any]]]]:
    """The stored events of ``run_id`` at or below seq ``upto`` as the verifier reads them:
    batches of CHUNK_ROWS rows (ROW_COLUMNS, ``fields`` as JSON text), so that memory holds
    two batches whatever the length of the chain (``ledger.sql.evidence``)."""
    with sql_evidence.event_rows(run_id=run_id, upto=upto, columns=ROW_COLUMNS, batch=CHUNK_ROWS) as batches:
        yield batches


def _checkpoints(run: Run) -> list[dict[str, Any]]:
    return [
        {**cp, "run_id": str(run.pk)}
        for cp in Checkpoint.objects.filter(run=run)
        .order_by("seq")
        .values("seq", "last_hash", "verifier_version", "key_id", "mac")
    ]


def _seal(run: Run, points: list[tuple[int, str]]) -> None:
    """Seal checkpoints at ``points``; with an external store configured, keep them there
    too, once they committed here (the store is never ahead of what the database committed)."""
    key_id = settings.FENCELINE["CHECKPOINT_SIGNING_KEY_ID"]
    key = settings.FENCELINE["CHECKPOINT_KEYS"][key_id]
    sealed = [
        Checkpoint(
            run=run,
            seq=seq,
            last_hash=last_hash,
            verifier_version=VERIFIER_VERSION,
            key_id=key_id,
            mac=checkpoint_mac(
                key, run_id=str(run.pk), seq=seq, last_hash=last_hash, verifier_version=VERIFIER_VERSION, key_id=key_id
            ),
        )
        for seq, last_hash in points
    ]
    # ignore_conflicts: a concurrent verifier sealed the same point: same content
    Checkpoint.objects.bulk_create(sealed, ignore_conflicts=True)
    store = configured_store()
    if store is not None:
        sealed_at = format_time(timezone.now())
        kept = [
            ExternalCheckpoint(str(run.pk), cp.seq, cp.last_hash, sealed_at, cp.verifier_version, cp.key_id, cp.mac)
            for cp in sealed
        ]
        transaction.on_commit(lambda: store.record(kept))


VERIFY_TASK = "ledger.tasks.verify_ledger_task"


def verification_request(*, run_id: object) -> None:
    """Verify (and seal) ``run_id``'s chain soon, once the caller's transaction commits.
    The task is named, not imported: the task module calls these services."""
    task = current_app.tasks[VERIFY_TASK]
    transaction.on_commit(lambda: task.delay(str(run_id)))


def run_verify(*, run_id: uuid.UUID | str, seal: bool = True, on_events: Callable[[int], None] | None = None) -> Report:
    """Verify one run's whole chain; seal new checkpoints when it holds; record the result."""
    run = Run.objects.get(pk=run_id)
    head_seq, head_hash = run.last_seq, run.last_hash
    checkpoints = _checkpoints(run)
    sealed_to = checkpoints[-1]["seq"] if checkpoints else 0
    observer = _Observer(
        seal_after=sealed_to, every=settings.FENCELINE["CHECKPOINT_EVERY"], sealable=[], on_events=on_events
    )
    trusted = (run.trusted_seq, run.trusted_hash) if run.trusted_seq else None

    with event_rows(run_id=run.pk, upto=head_seq) as rows:
        report = verify_rows(
            str(run.pk),
            rows,
            checkpoints,
            settings.FENCELINE["CHECKPOINT_KEYS"],
            expected_head=(head_seq, head_hash),
            trusted=trusted,
            event_keys=settings.FENCELINE["EVENT_KEYS"],
            observe=observer.see,
        )
    report = _check_payloads(run.pk, head_seq, report)
    if report.finding is None:
        report = _check_beyond_head(run, report)
    if report.finding is None:
        report = _check_rolled_back(run, report)

    if seal and report.finding is None:
        points = list(observer.sealable)
        if run.status in RUN_FINISHED and head_seq > max([sealed_to, *[s for s, _ in points]]):
            points.append((head_seq, head_hash))
        if points:
            _seal(run, points)
            report.last_trusted_checkpoint = points[-1][0]
            report.status = "VERIFIED" if points[-1][0] == report.head_seq else "UNSEALED"

    _record(run, report, observer, checkpoints, seal=seal)
    return report


def _check_payloads(run_id: object, upto: int, report: Report) -> Report:
    """The diagnostic payloads the chain commits to by digest (its version-2 events, at
    or below ``upto``), each against what the diagnostic plane keeps: present and hashing to
    its digest, or removed by retention (a marker row without bytes); anything else is the
    report's finding (``PayloadCheck``)."""
    check = PayloadCheck()
    for rows in sql_evidence.payload_rows(run_id=run_id, upto=upto, version=PAYLOAD_VERSION, batch=CHUNK_ROWS):
        for seq, fields, exists, body, removed_at in rows:
            if exists and removed_at is None:
                check.see(seq, _fields(fields), _fields(body))
            else:
                removed = None if removed_at is None else {"by": REMOVED_BY_RETENTION, "at": format_time(removed_at)}
                check.see(seq, _fields(fields), removed=removed)
    return check.conclude(report)


def _check_beyond_head(run: Run, report: Report) -> Report:
    """Rows past the run's recorded head cannot be legitimate appends (the head moves in
    the same transaction as the insert). Read the highest seq first, then the head."""
    highest = Event.objects.filter(run=run).aggregate(m=Max("seq"))["m"] or 0
    head = Run.objects.filter(pk=run.pk).values_list("last_seq", flat=True).get()
    if highest > head:
        report.finding = Finding(
            reason="fork",
            first_seq=head + 1,
            last_seq=highest,
            detail=f"events {head + 1}..{highest} lie beyond the run's recorded head {head}",
        )
        report.status = "BROKEN"
    return report


def _check_rolled_back(run: Run, report: Report) -> Report:
    """The run against the last checkpoint kept outside the database (when a store is
    configured): a head behind it, or another hash at its seq, is the finding ROLLED_BACK
    (integrity BROKEN, reason rolled_back), and nothing is sealed over it."""
    store = configured_store()
    found = None if store is None else rollback_of(str(run.pk), store=store)
    if found is not None:
        report.finding = Finding(reason=ROLLED_BACK, first_seq=found.first_seq, last_seq=found.seq, detail=found.detail)
        report.status = "BROKEN"
    return report


def _record(run: Run, report: Report, observer: _Observer, checkpoints: list[dict[str, Any]], *, seal: bool) -> None:
    changes = {
        "verified_at": timezone.now(),
        "verified_head_seq": report.head_seq,
        "verified_checkpoint_seq": report.last_trusted_checkpoint,
        "authorization_mismatches": observer.mismatches,
        "authorization_detail": observer.first_mismatch[:300],
    }
    finding = report.finding
    if finding is None:
        changes.update(broken_first_seq=None, broken_last_seq=None, broken_reason="", broken_detail="")
        trusted_seq = report.last_trusted_checkpoint
        if seal and trusted_seq and trusted_seq > (run.trusted_seq or 0):
            trusted_hash = next((cp["last_hash"] for cp in checkpoints if cp["seq"] == trusted_seq), None)
            if trusted_hash is None:  # sealed in this pass
                trusted_hash = (
                    Checkpoint.objects.filter(run=run, seq=trusted_seq).values_list("last_hash", flat=True).first()
                )
            changes.update(trusted_seq=trusted_seq, trusted_hash=trusted_hash)
    else:
        changes.update(
            broken_first_seq=finding.first_seq,
            broken_last_seq=finding.last_seq,
            broken_reason=finding.reason,
            broken_detail=finding.detail[:300],
        )
    # Only the verifier's own columns: the chain head and counters belong to transitions.
    Run.objects.filter(pk=run.pk).update(**changes)


@dataclass
class LedgerResult:
    runs: int = 0
    events: int = 0
    broken: int = 0


def ledger_verify(
    *,
    run_ids: Sequence[uuid.UUID | str] | None = None,
    limit: int | None = None,
    progress: Callable[[LedgerResult, Report], None] | None = None,
) -> LedgerResult:
    """Verify the given runs, or the runs whose chain moved since they were last verified
    (at most ``limit`` of them, least recently verified first)."""
    if run_ids is None:
        pending = Run.objects.filter(
            Q(verified_head_seq__isnull=True) | Q(verified_head_seq__lt=F("last_seq"))
        ).order_by(F("verified_at").asc(nulls_first=True))
        run_ids = list(pending.values_list("pk", flat=True)[: limit or settings.FENCELINE["VERIFIER_BATCH_RUNS"]])
    result = LedgerResult()
    for run_id in run_ids:
        report = run_verify(run_id=run_id)
        result.runs += 1
        result.events += report.events_checked
        result.broken += report.finding is not None
        if progress is not None:
            progress(result, report)
    return result
