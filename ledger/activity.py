"""The activity feed and audit search (``/activity/``): every chain event and every admin
record (a person's or a job's decision about a tenant) of the tenants a user may see,
newest first, narrowed by who acted, what kind of actor, tenant, type and time range.

Two sources, one order: (occurred_at, source, id) descending, chain events before admin
records at the same moment. Each page reads at most ``size + 1`` rows of each source past
the cursor, merges them and keeps ``size``: the same few queries on any page, each a walk
of an index (``event_recent``; ``event_type_recent`` for one type; ``event_not_by_workers``
for people and jobs), never a sort of the whole table."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Q, QuerySet

from ledger.models import AdminAction, Event, Tenant
from ledger.pagination import PAGE_SIZE, decode_raw_cursor, encode_cursor
from ledger.roles import tenants_for

# Who acted, by the start of the actor string (ledger.actors spells them).
KINDS: dict[str, str] = {
    "person": "user:",
    "job": "system",
    "worker": "worker:",
    "reconciler": "reconciler:",
    "provider": "provider:",
}
WORKER_PREFIX = KINDS["worker"]
EVENT, ACTION = 0, 1  # the sources, in the order they take at one moment


@dataclass(frozen=True)
class ActivityFilters:
    """What the feed is narrowed to; every field optional. ``tenant`` is a slug the user
    sees (else nothing matches); ``who`` a username or a whole actor string."""

    who: str = ""
    kind: str = ""
    tenant: str = ""
    type: str = ""
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class ActivityItem:
    source: str  # "event" (in a run's chain) or "action" (the tenant's admin record)
    id: int
    occurred_at: datetime
    tenant: str
    actor: str
    type: str
    run_id: UUID | None = None
    seq: int | None = None
    subject: str = ""
    reason: str = ""

    @property
    def rank(self) -> int:
        return EVENT if self.source == "event" else ACTION

    @property
    def key(self) -> tuple[datetime, int, int]:
        return (self.occurred_at, self.rank, self.id)

    @property
    def cursor(self) -> str:
        return encode_cursor(self.occurred_at, f"{self.rank}-{self.id}")


@dataclass(frozen=True)
class ActivityPage:
    rows: list[ActivityItem]
    next_cursor: str | None
    prev_cursor: str | None
    size: int


def actor_condition(who: str) -> Q:
    """``who`` as a condition on ``actor``: a bare name is a person (``user:<name>``); a
    worker by name matches each of its lease owners; any other actor string matches itself."""
    who = who.strip()
    if ":" not in who:
        return Q(actor=f"user:{who}")
    if who.startswith(WORKER_PREFIX) and "/" not in who:
        return Q(actor__startswith=f"{who}/")
    return Q(actor=who)


def is_event_type(kind: str) -> bool:
    """Chain events are typed in capitals (``CASE_RESOLVED``) or by workers as ``x.…``;
    admin records in lower case (``worker.drain``)."""
    return kind.startswith("x.") or kind[:1].isupper()


def _visible(user: User | AnonymousUser, slug: str) -> list[int] | None:
    """The tenant ids the feed reads, or None for "every tenant" (no condition at all)."""
    visible = tenants_for(user)
    if slug:
        return list(visible.filter(slug=slug).values_list("pk", flat=True))
    ids = list(visible.values_list("pk", flat=True))
    return None if len(ids) == Tenant.objects.count() else ids


def _events(filters: ActivityFilters, tenant_ids: list[int] | None) -> QuerySet[Event] | None:
    qs = Event.objects.all()
    if tenant_ids is not None:
        qs = qs.filter(run__tenant_id__in=tenant_ids)
    if filters.type:
        if not is_event_type(filters.type):
            return None
        qs = qs.filter(type=filters.type)
    by_worker = filters.kind == "worker" or filters.who.strip().startswith(WORKER_PREFIX)
    if filters.kind:
        qs = qs.filter(actor__startswith=KINDS[filters.kind])
    if filters.who:
        qs = qs.filter(actor_condition(filters.who))
    if (filters.kind or filters.who) and not by_worker:
        qs = qs.exclude(actor__startswith=WORKER_PREFIX)  # the small index of people's and jobs' events
    return qs.select_related("run__tenant").only(
        "id", "occurred_at", "type", "actor", "seq", "run_id", "run__tenant_id", "run__tenant__slug"
    )


def _actions(filters: ActivityFilters, tenant_ids: list[int] | None) -> QuerySet[AdminAction] | None:
    if filters.type and is_event_type(filters.type):
        return None
    if filters.kind in ("worker", "reconciler", "provider"):
        return None
    qs = AdminAction.objects.all()
    if tenant_ids is not None:
        qs = qs.filter(tenant_id__in=tenant_ids)
    if filters.type:
        qs = qs.filter(action=filters.type)
    if filters.kind:
        qs = qs.filter(actor__startswith=KINDS[filters.kind])
    if filters.who:
        qs = qs.filter(actor_condition(filters.who))
    return qs.select_related("tenant").only(
        "id", "occurred_at", "actor", "action", "subject", "reason", "tenant_id", "tenant__slug"
    )


def _in_range(qs: QuerySet[Any], filters: ActivityFilters) -> QuerySet[Any]:
    if filters.since is not None:
        qs = qs.filter(occurred_at__gte=filters.since)
    if filters.until is not None:
        qs = qs.filter(occurred_at__lt=filters.until)
    return qs


def _beyond(qs: QuerySet[Any], rank: int, at: tuple[datetime, int, int], *, older: bool) -> QuerySet[Any]:
    """The rows of one source past the position ``at`` = (moment, source, id): older
    (smaller keys) or newer (larger). The first condition bounds the index range."""
    moment, at_rank, at_id = at
    op, bound = ("lt", "lte") if older else ("gt", "gte")
    if rank == at_rank:
        return qs.filter(**{f"occurred_at__{bound}": moment}).filter(
            Q(**{f"occurred_at__{op}": moment}) | Q(occurred_at=moment, **{f"id__{op}": at_id})
        )
    ahead = rank < at_rank if older else rank > at_rank  # at the same moment, on this side of it
    return qs.filter(**{f"occurred_at__{bound if ahead else op}": moment})


def _item_of_event(event: Event) -> ActivityItem:
    return ActivityItem(
        "event", event.pk, event.occurred_at, event.run.tenant.slug, event.actor, event.type, event.run_id, event.seq
    )


def _item_of_action(action: AdminAction) -> ActivityItem:
    return ActivityItem(
        "action",
        action.pk,
        action.occurred_at,
        action.tenant.slug,
        action.actor,
        action.action,
        subject=action.subject,
        reason=action.reason,
    )


def _position(cursor: str | None) -> tuple[datetime, int, int] | None:
    decoded = decode_raw_cursor(cursor) if cursor else None
    if decoded is None:
        return None
    moment, key = decoded
    rank, _, pk = key.partition("-")
    if rank not in ("0", "1") or not pk.isdigit():
        return None
    return moment, int(rank), int(pk)


def _sources(user: User | AnonymousUser, filters: ActivityFilters) -> list[tuple[int, QuerySet[Any]]]:
    tenant_ids = _visible(user, filters.tenant)
    if tenant_ids == []:
        return []
    found: list[tuple[int, QuerySet[Any] | None]] = [
        (EVENT, _events(filters, tenant_ids)),
        (ACTION, _actions(filters, tenant_ids)),
    ]
    return [(rank, _in_range(qs, filters)) for rank, qs in found if qs is not None]


def _read(
    rank: int, qs: QuerySet[Any], at: tuple[datetime, int, int] | None, *, older: bool, limit: int
) -> list[ActivityItem]:
    if at is not None:
        qs = _beyond(qs, rank, at, older=older)
    sign = "-" if older else ""
    rows = qs.order_by(f"{sign}occurred_at", f"{sign}id")[:limit]
    to_item = _item_of_event if rank == EVENT else _item_of_action
    return [to_item(row) for row in rows]


def activity_page(
    *,
    user: User | AnonymousUser,
    filters: ActivityFilters,
    cursor: str | None = None,
    back: str | None = None,
    size: int = PAGE_SIZE,
) -> ActivityPage:
    """One page of what happened in the tenants ``user`` sees, newest first: after
    ``cursor`` (older), or, given ``back``, the page just newer than that cursor."""
    sources = _sources(user, filters)
    going_back = _position(back)
    at = going_back if going_back is not None else _position(cursor)
    older = going_back is None
    found: list[ActivityItem] = []
    for rank, qs in sources:
        found.extend(_read(rank, qs, at, older=older, limit=size + 1))
    found.sort(key=lambda item: item.key, reverse=older)
    more = len(found) > size
    rows = found[:size]
    if not older:
        rows.reverse()
        if not rows:  # nothing newer any more: the first page
            return activity_page(user=user, filters=filters, size=size)
        return ActivityPage(rows, rows[-1].cursor, rows[0].cursor if more else None, size)
    return ActivityPage(
        rows,
        rows[-1].cursor if more and rows else None,
        rows[0].cursor if at is not None and rows else None,
        size,
    )
