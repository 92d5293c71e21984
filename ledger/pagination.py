"""The one keyset pager of the console's lists: pages ordered by (a moment, id), each page
the same few queries however long the list, with an opaque cursor for the next page. Its
condition, :func:`past`, is also how the sweeps read on past rows they have seen."""

import base64
import json
import uuid
from datetime import datetime
from typing import TypeVar

from django.db.models import Model, Q, QuerySet

PAGE_SIZE = 50
M = TypeVar("M", bound=Model)


def encode_cursor(moment: datetime, pk: object) -> str:
    raw = json.dumps([moment.isoformat(), str(pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID | int] | None:
    """The (moment, id) a cursor names; None for anything that is not one of ours (the
    first page is shown instead of an error)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        moment, pk = json.loads(raw)
        return datetime.fromisoformat(moment), (int(pk) if str(pk).isdigit() else uuid.UUID(pk))
    except (ValueError, TypeError):
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


def keyset_page[M: Model](
    queryset: QuerySet[M], *, order_field: str, cursor: str | None, size: int = PAGE_SIZE, descending: bool = False
) -> tuple[list[M], str | None]:
    """One page ordered by (order_field, id) after ``cursor`` (newest first when
    ``descending``); returns (rows, next_cursor)."""
    sign = "-" if descending else ""
    queryset = queryset.order_by(f"{sign}{order_field}", f"{sign}id")
    after = decode_cursor(cursor) if cursor else None
    if after is not None:
        queryset = past(queryset, order_field, *after, descending=descending)
    rows = list(queryset[: size + 1])
    if len(rows) > size:
        rows = rows[:size]
        last = rows[-1]
        return rows, encode_cursor(getattr(last, order_field), last.pk)
    return rows, None
