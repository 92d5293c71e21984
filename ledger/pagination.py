"""The one keyset pager of the console's lists: pages ordered by (a moment, id), each page
the same few queries however long the list, with opaque cursors for the next and the
previous page and a total counted only up to a cap ("1,000+"). Its condition, :func:`past`,
is also how the sweeps read on past rows they have seen."""

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from django.db.models import Model, Q, QuerySet

PAGE_SIZE = 50
PAGE_SIZES = (25, 50, 100)  # what a reader may choose; anything else is refused with a notice
COUNT_CAP = 1000  # a list's total is counted up to this, then shown as "1,000+"
M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class Page[T]:
    """One page of a list: its rows, the cursors of the pages after and before it (None
    at either end), and the list's total, counted at most to ``COUNT_CAP`` (``capped``
    when there are more)."""

    rows: list[T]
    next_cursor: str | None
    prev_cursor: str | None
    total: int
    capped: bool
    size: int


def encode_cursor(moment: datetime, pk: object) -> str:
    raw = json.dumps([moment.isoformat(), str(pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_raw_cursor(cursor: str) -> tuple[datetime, str] | None:
    """The (moment, key text) a cursor names; None for anything that is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        moment, pk = json.loads(raw)
        return datetime.fromisoformat(moment), str(pk)
    except (ValueError, TypeError):
        return None


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID | int] | None:
    """The (moment, id) a cursor names; None for anything that is not one of ours (the
    first page is shown instead of an error)."""
    decoded = decode_raw_cursor(cursor)
    if decoded is None:
        return None
    moment, pk = decoded
    try:
        return moment, (int(pk) if pk.isdigit() else uuid.UUID(pk))
    except ValueError:
        return None


def past[M: Model](
    queryset: QuerySet[M], order_field: str, moment: object, pk: object, *, descending: bool = False
) -> QuerySet[M]:
    """The rows of ``queryset`` after (``moment``, ``pk``) in (order_field, id) order (before
    it when ``descending``). The first condition bounds the index range; the second is the
    exact keyset."""
    after_op, bound_op = ("lt", "lte") if descending else ("gt", "gte")
    return queryset.filter(**{f"{order_field}__{bound_op}": moment}).filter(
        Q(**{f"{order_field}__{after_op}": moment}) | Q(**{order_field: moment, f"id__{after_op}": pk})
    )


def capped_count[M: Model](queryset: QuerySet[M], cap: int = COUNT_CAP) -> tuple[int, bool]:
    """How many rows ``queryset`` holds, counted at most to ``cap`` (one COUNT over a
    LIMIT cap + 1 subquery: never a full count of a big table); and whether there are more."""
    counted = queryset.order_by()[: cap + 1].count()
    return min(counted, cap), counted > cap


def page_size(size: int | None) -> int:
    """``size`` if it is one of PAGE_SIZES, else the default."""
    return size if size in PAGE_SIZES else PAGE_SIZE


def keyset_page[M: Model](
    queryset: QuerySet[M],
    *,
    order_field: str,
    cursor: str | None,
    back: str | None = None,
    size: int = PAGE_SIZE,
    descending: bool = False,
    count: bool = True,
) -> Page[M]:
    """One page ordered by (order_field, id) after ``cursor`` (newest first when
    ``descending``), or, given ``back``, the page that ends just before that cursor; with
    the cursors of its neighbours and the capped total (``count``)."""
    total, capped = capped_count(queryset) if count else (0, False)
    sign, reverse = ("-", "") if descending else ("", "-")
    going_back = decode_cursor(back) if back else None
    if going_back is not None:
        before = past(
            queryset.order_by(f"{reverse}{order_field}", f"{reverse}id"),
            order_field,
            *going_back,
            descending=not descending,
        )
        rows = list(before[: size + 1])
        more_before = len(rows) > size
        rows = rows[:size][::-1]
        if not rows:  # nothing before it any more: the first page
            return keyset_page(queryset, order_field=order_field, cursor=None, size=size, descending=descending)
        return Page(
            rows,
            _cursor_of(rows[-1], order_field),
            _cursor_of(rows[0], order_field) if more_before else None,
            total,
            capped,
            size,
        )
    queryset = queryset.order_by(f"{sign}{order_field}", f"{sign}id")
    after = decode_cursor(cursor) if cursor else None
    if after is not None:
        queryset = past(queryset, order_field, *after, descending=descending)
    rows = list(queryset[: size + 1])
    next_cursor = None
    if len(rows) > size:
        rows = rows[:size]
        next_cursor = _cursor_of(rows[-1], order_field)
    prev_cursor = _cursor_of(rows[0], order_field) if after is not None and rows else None
    return Page(rows, next_cursor, prev_cursor, total, capped, size)


def _cursor_of(row: Model, order_field: str) -> str:
    return encode_cursor(getattr(row, order_field), row.pk)
