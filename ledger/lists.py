"""Reads the console's lists share: a user's saved views of one list (their own only)."""

from django.contrib.auth.models import AnonymousUser, User

from ledger.models import SavedView


def saved_views_for(*, user: User | AnonymousUser, list_name: str) -> list[SavedView]:
    if not user.is_authenticated:
        return []
    return list(SavedView.objects.filter(user_id=user.pk, list_name=list_name).order_by("name"))
