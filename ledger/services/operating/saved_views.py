"""Saved views: a console user names a list's query string and finds it again. Each is the
user's own: saved, replaced and deleted only by them (another user's is NotFound)."""

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.db import transaction

from ledger.boundary import check_text
from ledger.errors import InvalidInput, NotFound
from ledger.models import SavedView

MAX_VIEWS_PER_LIST = 20
LIST_NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
# Cursors and page numbers are where a reader is, not what they look at: never saved.
NOT_SAVED = frozenset({"after", "before", "back", "page"})


def saved_query(querystring: str) -> str:
    """``querystring`` without cursors and page numbers, its empty values dropped."""
    pairs = [(k, v) for k, v in parse_qsl(querystring, keep_blank_values=False) if k not in NOT_SAVED]
    return urlencode(pairs)


def saved_view_save(*, user: Any, list_name: str, name: str, querystring: str) -> SavedView:
    """Save (or replace, by name) the user's view of ``list_name``."""
    if not LIST_NAME.match(list_name):
        raise InvalidInput("there is no such list", field="list")
    name = name.strip()
    if not name or len(name) > 80:
        raise InvalidInput("a saved view needs a name of 1 to 80 characters", field="name")
    check_text(name, path="name")
    query = saved_query(querystring)
    if len(query) > 1000:
        raise InvalidInput("this view's filters are too long to save (1,000 characters at most)", field="query")
    check_text(query, path="query")
    with transaction.atomic():
        mine = SavedView.objects.select_for_update().filter(user=user, list_name=list_name)
        existing = {view.name: view for view in mine}
        view = existing.get(name)
        if view is not None:
            view.querystring = query
            view.save(update_fields=["querystring"])
            return view
        if len(existing) >= MAX_VIEWS_PER_LIST:
            raise InvalidInput(
                f"you already have {MAX_VIEWS_PER_LIST} saved views of this list: delete one first", field="name"
            )
        return SavedView.objects.create(user=user, list_name=list_name, name=name, querystring=query)


def saved_view_delete(*, user: Any, view_id: int) -> SavedView:
    """Delete one of the user's own saved views; another user's is NotFound."""
    view = SavedView.objects.filter(user=user, pk=view_id).first()
    if view is None:
        raise NotFound("no such saved view")
    view.delete()
    return view
