"""The console's lists, paged one way: the cursor and page size a request asks for
(``paging``), and what the shared footer and saved-views bar show (``pager``): first,
previous and next page, the total counted up to a cap ("1,000+"), the page size choice,
and the user's saved views of the list."""

from dataclasses import dataclass
from typing import Any, Protocol

from django.http import HttpRequest, QueryDict

from console.views.common import chosen
from ledger.lists import saved_views_for
from ledger.pagination import COUNT_CAP, PAGE_SIZE, PAGE_SIZES

# What only says where a reader is in a list, never what the list shows.
POSITION = ("after", "before", "back", "page")
# Lists with saved views: list name -> URL name of the list page.
LISTS = {
    "runs": "runs",
    "cases": "cases",
    "approvals": "approvals",
    "credentials": "credentials",
    "activity": "activity",
}


class Paged(Protocol):
    @property
    def next_cursor(self) -> str | None: ...
    @property
    def prev_cursor(self) -> str | None: ...


@dataclass(frozen=True)
class Paging:
    """Where a request is in a list: the cursor forward (``after``, or the list's own
    name for it), the cursor back (``back``), the page size, its number, and a notice for
    a page size that is not one of PAGE_SIZES."""

    cursor: str | None
    back: str | None
    size: int
    number: int
    notice: str


def paging(request: HttpRequest, *, cursor_param: str = "after") -> Paging:
    size_text, notice = chosen(request, "size", [str(s) for s in PAGE_SIZES], str(PAGE_SIZE))
    notice = notice.replace("There is no size", "There is no page size")
    cursor = request.GET.get(cursor_param) or None
    back = request.GET.get("back") or None
    number = 1
    if cursor or back:
        try:
            number = max(int(request.GET.get("page", "2")), 1)
        except ValueError:
            number = 2
    return Paging(cursor, back, int(size_text), number, notice)


def total_text(total: int, capped: bool) -> str:
    return f"{COUNT_CAP:,}+" if capped else f"{total:,}"


def _url(query: QueryDict, **extra: object) -> str:
    q = query.copy()
    for name, value in extra.items():
        q[name] = str(value)
    return f"?{q.urlencode()}" if q else "?"


def pager(
    request: HttpRequest,
    page: Paged,
    where: Paging,
    *,
    list_name: str,
    cursor_param: str = "after",
    total: int | None = None,
    capped: bool = False,
    noun: str = "rows",
) -> dict[str, Any]:
    """The context of ``console/_pager.html`` and ``console/_saved_views.html``."""
    base = request.GET.copy()
    for name in POSITION:
        base.pop(name, None)
    sizes = []
    for size in PAGE_SIZES:
        chosen_query = base.copy()
        chosen_query["size"] = str(size)
        sizes.append({"size": size, "url": f"?{chosen_query.urlencode()}", "current": size == where.size})
    first = where.number > 1 or page.prev_cursor is not None
    return {
        "list_name": list_name,
        "number": where.number,
        "size": where.size,
        "sizes": sizes,
        "noun": noun,
        "total": None if total is None else total_text(total, capped),
        "base_query": base.urlencode(),
        "first_url": f"?{base.urlencode()}" if first else "",
        "prev_url": _url(base, back=page.prev_cursor, page=max(where.number - 1, 1)) if page.prev_cursor else "",
        "next_url": _url(base, **{cursor_param: page.next_cursor, "page": where.number + 1})
        if page.next_cursor
        else "",
        "saved_views": saved_views_for(user=request.user, list_name=list_name) if list_name in LISTS else [],
        "path": request.path,
    }
