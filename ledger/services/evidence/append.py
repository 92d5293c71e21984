"""Appending to a run's evidence chain.

A caller that holds the row lock on the run (see ``ledger.services.core.fencing``) collects the
events of its transition in a :class:`ChainBatch` and writes them with ``commit()`` inside
the same transaction: one INSERT for the events and one UPDATE per run head.
"""

import json
import math
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models import Model

from ledger.boundary import RAW_PAYLOAD, check_fields, check_text, classify_key, path_segment
from ledger.chain import EventSigner, canonical_bytes, format_time, hash_bytes
from ledger.errors import ForbiddenField, InvalidInput
from ledger.ids import uuid7
from ledger.models import Event, Run
from ledger.observability.tracing import TRACE_FIELD, current_trace_id
from ledger.sql import chain as sql_chain
from ledger.sql import rows as sql_rows
from ledger.states import RUN_FINISHED, Phase
from ledger.storable import storage_problem
from ledger.versioning import CURRENT_SCHEMA_VERSION


def json_safe(fields: dict[str, Any], *, root: str = "fields") -> dict[str, Any]:
    """The fields as JSON: ids and times as the strings they are stored as. Refuses, naming
    the field, what the database would not store byte for byte (``ledger.storable``): an
    accepted event's stored form always hashes to its recorded hash."""
    try:
        fields = _native(fields)
    except _NotPlain:  # anything unusual takes JSON's own way there and back
        try:
            fields = json.loads(json.dumps(fields, allow_nan=False, default=_encode))
        except ValueError:
            raise InvalidInput(f"{root}: numbers must be finite", field=root) from None
    problem = storage_problem(fields, root=root, segment=path_segment)
    if problem is not None:
        raise InvalidInput(f"{problem[0]}: {problem[1]}", field=problem[0])
    return fields


class _NotPlain(Exception):
    pass


def _native(value: object) -> Any:
    """``json.loads(json.dumps(value))`` for the values events are made of (str, int, bool,
    None, finite floats, UUIDs, times, dicts with str keys, lists and tuples), without the
    round trip; anything else raises _NotPlain."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        out = {}
        for key, child in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                raise _NotPlain
            out[key] = _native(child)
        return out
    if kind is list or kind is tuple:
        return [_native(child) for child in value]  # type: ignore[attr-defined]
    if kind is uuid.UUID:
        return str(value)
    if kind is datetime:
        return format_time(value)  # type: ignore[arg-type]
    if kind is float and math.isfinite(value):  # type: ignore[arg-type]
        return value
    if isinstance(value, str):  # an enum's value: JSON writes the string itself
        return str.__str__(value)
    raise _NotPlain


def _encode(value: object) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return format_time(value)
    raise TypeError(f"event field of type {type(value).__name__} is not serializable")


_signer: EventSigner | None = None


def event_signer() -> EventSigner:
    """The signer of new events: FENCELINE["EVENT_SIGNING_KEY_ID"]'s key, prepared once per
    process and prepared again only when the settings name another key (tests, rotation)."""
    global _signer
    conf = settings.FENCELINE
    key_id = conf["EVENT_SIGNING_KEY_ID"]
    key = conf["EVENT_KEYS"][key_id]
    signer = _signer
    if signer is None or signer.key_id != key_id or signer.key != key:
        signer = _signer = EventSigner(key_id, key)
    return signer


def build_event(
    run: Run,
    *,
    type: str,
    actor: str,
    fields: dict[str, Any],
    occurred_at: datetime,
    schema_version: int = CURRENT_SCHEMA_VERSION,
) -> Event:
    """The next event of ``run``'s chain, with its MAC; advances the in-memory chain head.
    ``schema_version`` PAYLOAD_VERSION: the fields commit to a diagnostic payload by its
    digest (``ledger.services.evidence.planes``)."""
    fields = json_safe(fields)
    check_fields(fields)  # the secret boundary (invariant 6), before anything is hashed or written
    check_text(actor, path="actor")
    signer = event_signer()
    return _chained(run, type, actor, fields, occurred_at, format_time(occurred_at), signer, schema_version)


def build_events(
    entries: Sequence[tuple[Run, dict[str, Any]]], *, type: str, actor: str, occurred_at: datetime
) -> list[Event]:
    """The next event of each entry's run, in order, each exactly what :func:`build_event`
    makes of it (a run may come more than once: its events follow one another in its
    chain), for the reapers' batches of hundreds of runs. What the events share is done
    once: the actor's check, the signer, the time's text. Every entry's fields pass
    :func:`json_safe` and the secret boundary before any event is built, so a refusal
    leaves every run's in-memory head as it was."""
    checked = [json_safe(fields) for _, fields in entries]
    _check_all(checked)  # the secret boundary (invariant 6), before anything is hashed or written
    check_text(actor, path="actor")
    when = format_time(occurred_at)
    signer = event_signer()
    return [
        _chained(run, type, actor, fields, occurred_at, when, signer)
        for (run, _), fields in zip(entries, checked, strict=True)
    ]


def _chained(
    run: Run,
    type: str,
    actor: str,
    fields: Any,
    occurred_at: datetime,
    when: str,
    signer: EventSigner,
    version: int = CURRENT_SCHEMA_VERSION,
) -> Event:
    """The event after ``run``'s in-memory head (checked fields; ``when``: the time's
    canonical text), hashed, linked and signed; the head advances to it. Within a call that
    carried a traceparent the fields also name its trace id (``TRACE_FIELD``)."""
    trace_id = current_trace_id()
    if trace_id and isinstance(fields, dict) and TRACE_FIELD not in fields:
        fields = {**fields, TRACE_FIELD: trace_id}
    seq = run.last_seq + 1
    event_id = uuid7()  # time-ordered: appends land at the right-hand end of the event_id index
    run_id = str(run.pk)
    digest = hash_bytes(
        canonical_bytes(
            run_id=run_id,
            seq=seq,
            event_id=str(event_id),
            type=type,
            schema_version=version,
            actor=actor,
            occurred_at=when,
            fields=fields,
            prev_hash=run.last_hash,
        )
    )
    event = sql_rows.unsaved(
        Event,
        id=None,
        run_id=run.pk,
        seq=seq,
        event_id=event_id,
        type=type,
        actor=actor,
        occurred_at=occurred_at,
        fields=fields,
        prev_hash=run.last_hash,
        hash=digest,
        mac_key_id=signer.key_id,
        mac=signer.mac(run_id=run_id, seq=seq, hash=digest),
        schema_version=version,
    )
    _EVENT_RUN.set_cached_value(event, run)
    run.last_seq = seq
    run.last_hash = digest
    return event


def _check_all(documents: list[dict[str, Any]]) -> None:
    """:func:`check_fields` of every document, judging once what documents of one flat
    shape share. A document whose values are all strings, numbers, booleans or None (what
    a reaper's events are made of) refuses only through its keys, what each key allows
    (which depends on the key and the type of its value), and its strings: so the first
    document of each shape (its keys and the type of each value) goes through
    ``check_fields`` whole, and of the others only the strings not judged yet, each by
    ``check_text`` at the path ``check_fields`` would name. Any other document goes through
    ``check_fields`` whole. Refuses what ``check_fields`` of each would refuse."""
    paths: dict[tuple[tuple[str, type], ...], dict[str, str]] = {}  # shape -> the path of each key
    judged: set[str] = set()
    for document in documents:
        shape = tuple((key, type(value)) for key, value in document.items())
        if not all(kind in _SCALARS for _, kind in shape):
            check_fields(document)
            continue
        known = paths.get(shape)
        if known is None:
            check_fields(document)
            paths[shape] = {key: path_segment(key) for key in document}
            judged.update(value for value in document.values() if type(value) is str)
            continue
        for key, value in document.items():
            if type(value) is str and value not in judged:
                check_text(value, path=known[key])
                judged.add(value)


_SCALARS = frozenset({str, int, float, bool, type(None)})


@dataclass(frozen=True)
class _Mark:
    events: int
    deferred: int
    heads: dict[object, dict[str, Any]]


@dataclass(frozen=True)
class _Deferred:
    """A conditional UPDATE that must change exactly one row, written with the chain."""

    update: sql_chain.Update
    key: tuple[object, ...]  # the row: (model, its where values)
    refusal: Callable[[], Exception]


_EVENT_RUN = Event._meta.get_field("run")

# What Django hands an execute wrapper to go on with: (sql, params, many, context).
type _Execute = Callable[[str, Any, bool, dict[str, Any]], Any]


class ChainBatch:
    """Events of one transaction, possibly over several (locked) runs, and the phase counts
    those runs' operations moved by. ``commit`` writes both with each run's chain head.

    A batch made with ``defer=True`` (the fence's) also holds back the conditional UPDATEs
    of :meth:`update` until ``commit``, which sends them, the events and the head as one
    statement. Nothing reads around them: while one is held back, any other statement on
    the connection first sends it (a Django execute wrapper), so every read in the
    transaction sees the writes before it, as if they had been sent at once. Whoever makes
    such a batch calls :meth:`close` when the transaction ends, committed or not."""

    def __init__(self, now: datetime, *, defer: bool = False) -> None:
        self.now = now
        self.events: list[Event] = []
        self._runs: dict[object, Run] = {}
        self._defer = defer
        self._deferred: list[_Deferred] = []
        self._guarding = False

    def append(
        self, run: Run, type: str, *, actor: str, fields: dict[str, Any], schema_version: int = CURRENT_SCHEMA_VERSION
    ) -> Event:
        event = build_event(
            run, type=type, actor=actor, fields=fields, occurred_at=self.now, schema_version=schema_version
        )
        if type not in NOT_PROGRESS:
            run.last_progress_at = self.now
        self.events.append(event)
        self._runs[run.pk] = run
        return event

    def append_many(self, entries: Sequence[tuple[Run, dict[str, Any]]], type: str, *, actor: str) -> list[Event]:
        """:meth:`append` of one event of ``type`` for each (run, fields) entry, in order,
        built at once (:func:`build_events`): a reaper's batch."""
        events = build_events(entries, type=type, actor=actor, occurred_at=self.now)
        progress = type not in NOT_PROGRESS
        runs = self._runs
        for run, _ in entries:
            if progress:
                run.last_progress_at = self.now
            runs[run.pk] = run
        self.events.extend(events)
        return events

    def count_move(self, run: Run, source: str | None, target: str) -> None:
        """One operation of ``run`` moved from ``source`` (None: new) to ``target``."""
        if source is not None:
            field = phase_count_field(source)
            setattr(run, field, getattr(run, field) - 1)
        field = phase_count_field(target)
        setattr(run, field, getattr(run, field) + 1)
        self._runs[run.pk] = run

    def update(
        self, model: type[Model], values: dict[str, Any], *, where: dict[str, Any], refusal: Callable[[], Exception]
    ) -> None:
        """``UPDATE model SET values WHERE where``, which must change exactly one row, else
        ``refusal()`` is raised — now, or (held back) when the batch commits."""
        if not self._defer or not sql_rows.plain(values.values()):
            if sql_rows.update(model, values, **where) != 1:
                raise refusal()
            return
        key = (model, *where.values())
        if any(held.key == key for held in self._deferred):
            self._send_deferred()  # one statement cannot change a row twice
        assigned, keys = tuple(values), tuple(where)
        params = [sql_rows.prep(model, name, values[name]) for name in assigned]
        params += [sql_rows.prep(model, name, where[name]) for name in keys]
        self._deferred.append(_Deferred(sql_chain.Update(model, assigned, keys, params), key, refusal))
        if not self._guarding:
            connection.execute_wrappers.append(self._before_any_statement)
            self._guarding = True

    def _before_any_statement(
        self, execute: _Execute, sql: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        if self._deferred:
            self._send_deferred()
        return execute(sql, params, many, context)

    def _take_deferred(self) -> list[_Deferred]:
        held, self._deferred = self._deferred, []
        if self._guarding:
            connection.execute_wrappers.remove(self._before_any_statement)
            self._guarding = False
        return held

    def _send_deferred(self) -> None:
        self._send(self._take_deferred())

    def close(self) -> None:
        """The transaction is over: forget what was held back (committed or rolled back)."""
        self._take_deferred()

    def mark(self) -> "_Mark":
        """Where the batch stands now, for :meth:`rewind`."""
        heads = {pk: {name: getattr(run, name) for name in HEAD_FIELDS} for pk, run in self._runs.items()}
        return _Mark(len(self.events), len(self._deferred), heads)

    def rewind(self, mark: "_Mark") -> None:
        """Take back the events, counts and held-back updates gathered since ``mark``."""
        del self.events[mark.events :]
        del self._deferred[mark.deferred :]
        for pk, run in list(self._runs.items()):
            if pk in mark.heads:
                for name, value in mark.heads[pk].items():
                    setattr(run, name, value)
            else:
                del self._runs[pk]

    @contextmanager
    def savepoint(self) -> Iterator[Self]:
        """A database savepoint that also takes back, on an exception, the events, counts
        and held-back updates this batch gathered inside it."""
        mark = self.mark()
        try:
            with transaction.atomic():
                try:
                    yield self
                except BaseException:
                    del self._deferred[mark.deferred :]  # before ROLLBACK TO SAVEPOINT, which would send them
                    raise
        except BaseException:
            self.rewind(mark)
            raise

    def commit_inserting(self, instance: Model, *, conflict: tuple[str, ...], mark: "_Mark") -> bool:
        """Commit now, ``instance``'s INSERT first (skipped on a ``conflict`` of that unique
        key): the batch's events and run head are written only when the row was inserted,
        in the same statement. False: nothing was written, and the batch is rewound to
        ``mark`` (taken before the events that belonged to the insert)."""
        runs = _flagged(self._runs.values())
        if len(runs) != 1 or not 0 < len(self.events) <= EVENTS_PER_STATEMENT:
            if not sql_rows.insert(instance, conflict=conflict):
                self.rewind(mark)
                return False
            self.commit()
        else:
            self._send_deferred()
            run = runs[0]
            names, row = sql_rows.insert_params(instance)
            rows = sql_chain.inserting(
                names=names,
                row=row,
                model=type(instance),
                conflict=conflict,
                events=self.events,
                run=run,
                head=HEAD_FIELDS,
            )
            if not rows:
                self.rewind(mark)
                return False
            instance._state.adding = False
            instance._state.db = DEFAULT_DB_ALIAS
            _stored(self.events, rows)
        self.events, self._runs = [], {}
        return True

    def commit(self) -> list[Event]:
        held = self._take_deferred()
        if not self._runs:
            self._send(held)
            return []
        runs = _flagged(self._runs.values())
        if len(runs) == 1 and 0 < len(self.events) <= EVENTS_PER_STATEMENT:
            # The common case, a transition: its update, its events and the head in one round trip.
            rows = sql_chain.transition(
                updates=[h.update for h in held], events=self.events, run=runs[0], head=HEAD_FIELDS
            )
            for h, count in zip(held, rows[0][: len(held)], strict=True):
                if count != 1:
                    raise h.refusal()
            _stored(self.events, [row[len(held) :] for row in rows])
            return self.events
        # Many runs (a reaper's batch, a drain): the events, then the heads, each in
        # statements of one fixed shape whatever the count (one array per column), which
        # PostgreSQL plans once per connection.
        self._send(held)
        for start in range(0, len(self.events), ROWS_PER_ARRAY_STATEMENT):
            chunk = self.events[start : start + ROWS_PER_ARRAY_STATEMENT]
            _stored(chunk, sql_chain.insert_events(chunk))
        for start in range(0, len(runs), ROWS_PER_ARRAY_STATEMENT):
            sql_chain.update_heads(runs[start : start + ROWS_PER_ARRAY_STATEMENT], HEAD_FIELDS)
        return self.events

    @staticmethod
    def _send(held: list[_Deferred]) -> None:
        for h in held:
            if not sql_chain.update_one(h.update):
                raise h.refusal()


def _flagged(runs: Iterable[Run]) -> list[Run]:
    """``runs``, each with its ``may_be_in_flight`` as its head will be written: False once
    it has finished with nothing waiting for approval, authorized or dispatched."""
    flagged = list(runs)
    for run in flagged:
        run.may_be_in_flight = run.status not in RUN_FINISHED or (
            run.n_pending_approval + run.n_authorized + run.n_dispatched > 0
        )
    return flagged


def _stored(events: list[Event], rows: Iterable[sql_chain.Row]) -> None:
    """Give the inserted events their primary keys, matched by event id (``RETURNING``
    promises no order)."""
    ids = {event_id: pk for pk, event_id in rows}
    for event in events:
        event.__dict__["id"] = ids[event.event_id]  # the primary key, set as from_db sets it
        event._state.adding = False
        event._state.db = DEFAULT_DB_ALIAS


def phase_count_field(phase: str) -> str:
    return f"n_{phase.lower()}"


PHASE_COUNT_FIELDS = [phase_count_field(phase) for phase in Phase.values]
# Written with every commit; the runs are locked, so the in-memory values are current.
# At most this many events per INSERT (PostgreSQL takes at most 65,535 parameters).
EVENTS_PER_STATEMENT = 1000
# At most this many rows per statement of arrays (a bound on one statement's size).
ROWS_PER_ARRAY_STATEMENT = 10_000
HEAD_FIELDS = (
    "last_seq",
    "last_hash",
    "last_progress_at",
    *PHASE_COUNT_FIELDS,
    "n_capabilities",
    "n_resources",
    "n_approvals",
    "may_be_in_flight",
)
# Events that are not progress: a lease kept alive, a stale write refused, what an instance's
# idleness, the reapers or an admin's cleanup decisions record. Every other event moves Run.last_progress_at, from which
# the idle limit counts (fence/leases.py lease_renew).
NOT_PROGRESS = frozenset(
    {
        "LEASE_RENEWED",
        "STALE_TOKEN_REJECTED",
        "INSTANCE_IDLE",
        "INSTANCE_RUNNING",
        "INSTANCE_EXPIRED",
        "INSTANCE_REAPING",
        "INSTANCE_RELEASED",
        "RESOURCE_RELEASE_REQUESTED",
        "RESOURCE_RELEASED",
        "RESOURCE_CLEANUP_FAILED",
        "RESOURCE_RETRY_REQUESTED",
        "RESOURCE_MARKED_RELEASED",
        "DELIVERY_RECORDED",
        "RETRY_REFUSED",
    }
)


# --- events appended by workers ---------------------------------------------------------
WORKER_EVENT_TYPE = re.compile(r"^(NOTE|x\.[a-z0-9][a-z0-9_.\-]{0,62})$")
MAX_WORKER_FIELDS_BYTES = 16 * 1024


def checked_document(value: object, *, field: str, max_bytes: int, raw_payloads: bool = False) -> dict[str, Any]:
    """A JSON object a worker sends to be kept (event fields, checkpoint state, a diagnostic
    payload): storable as sent, at most ``max_bytes`` as compact JSON, and through the secret
    boundary; else InvalidInput or ForbiddenField naming the path under ``field``.
    ``raw_payloads``: the diagnostic plane, where keys that name a raw payload (``stderr``,
    ``response``) are what is kept; any credential is still refused."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{field} must be a JSON object", field=field)
    document = json_safe(value, root=field)
    if len(json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()) > max_bytes:
        raise InvalidInput(f"{field} must be at most {max_bytes} bytes as JSON", field=field)
    try:
        check_fields(document, root=field)
    except ForbiddenField as refusal:
        # check_fields reports a raw-payload key only once the whole document held no credential.
        if not raw_payloads or refusal.rule != "forbidden key" or not _raw_payload_key(refusal.path):
            raise
    return document


def _raw_payload_key(path: str) -> bool:
    return classify_key(path.rsplit(".", 1)[-1]) == RAW_PAYLOAD


def validate_worker_event(type: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Worker events: type NOTE or ``x.<name>``; fields a storable JSON object of at most 16 KB."""
    if not WORKER_EVENT_TYPE.match(type):
        raise InvalidInput(
            "type must be NOTE or start with 'x.' followed by lowercase letters, digits, _ . -", field="type"
        )
    check_text(type, path="type")  # it is stored in the chain for good
    return checked_document(fields, field="fields", max_bytes=MAX_WORKER_FIELDS_BYTES)
