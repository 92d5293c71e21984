"""A person's own route (``PersonalRoute``): where "my cases" and "my approvals" go, set by
the person on their settings page. The target is an https URL, judged exactly as a tenant's
webhook target is (``targets.target_check``: the secret boundary, then public addresses
only, unless the operator allows a host by name; an operator's ``ref:`` names are the
tenants' endpoints', not a person's), or an email address, kept as ``mailto:<address>`` and
sent through Django's email backend. A webhook's signing secret is derived as an endpoint's,
from the route's id (``route:<id>``) and key version, and shown to the person when set.

Deliveries to a route are made only for a tenant where the person holds the role at that
moment (``approvals/services/notifications.py``); the route itself names no tenant."""

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ledger.boundary import check_text
from ledger.errors import InvalidInput
from ledger.models import PersonalRoute
from ledger.models.notifications import PersonalKind
from ledger.services.notifications.targets import MAX_TARGET_LENGTH, REF_PREFIX, signing_secret, target_check

MAILTO = "mailto:"


@dataclass(frozen=True)
class RouteSaved:
    route: PersonalRoute | None  # None: removed
    secret: str  # a webhook's signing secret, to be shown once; "" for an email address


def route_target_check(target: object) -> str:
    """The target to store: an https URL that passes ``target_check``, or ``mailto:`` and a
    valid email address. InvalidInput names the field ``target`` (never its value)."""
    if not isinstance(target, str) or not target.strip():
        raise InvalidInput("a route names an https URL or an email address", field="target")
    target = target.strip().removeprefix(MAILTO)
    if "://" not in target and "@" in target:
        if len(target) > MAX_TARGET_LENGTH - len(MAILTO):
            raise InvalidInput("the email address is too long", field="target")
        try:
            validate_email(target)
        except ValidationError:
            raise InvalidInput("that is not an email address", field="target") from None
        check_text(target, path="target")
        return MAILTO + target
    if target.startswith(REF_PREFIX):
        raise InvalidInput("a personal route is an https URL or an email address, not a ref: name", field="target")
    return target_check(target)


def route_kinds_check(kinds: object) -> list[str]:
    if not isinstance(kinds, list | tuple) or not all(k in PersonalKind.values for k in kinds):
        raise InvalidInput(f"kinds are among: {', '.join(PersonalKind.values)}", field="kinds")
    return [k for k in PersonalKind.values if k in kinds]


def route_secret(route: PersonalRoute) -> str:
    return signing_secret(endpoint_id=f"route:{route.pk}", key_id=route.key_id, key_version=route.key_version)


def route_target_label(target: str) -> str:
    """What a page shows of a target: an email address whole, a URL by scheme and host."""
    if target.startswith(MAILTO):
        return target.removeprefix(MAILTO)
    parts = urlsplit(target)
    return f"{parts.scheme}://{parts.netloc}/…" if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/"


@transaction.atomic
def route_set(*, user: Any, target: str, kinds: list[str], remove: bool = False) -> RouteSaved:
    """Set the signed-in ``user``'s own route; an empty target keeps the current one (only
    the kinds change); ``remove`` deletes it and its deliveries. A new webhook target, or a
    new route, gets a new signing secret."""
    if user is None or not user.is_authenticated:
        raise InvalidInput("only a signed-in person has a route")
    existing = PersonalRoute.objects.select_for_update().filter(user_id=user.pk).first()
    if remove:
        if existing is not None:
            existing.delete()
        return RouteSaved(route=None, secret="")
    if (not isinstance(target, str) or not target.strip()) and existing is not None:
        target = existing.target
    target = route_target_check(target)
    kinds = route_kinds_check(kinds)
    now = timezone.now()
    if existing is None:
        route = PersonalRoute.objects.create(
            user_id=user.pk,
            target=target,
            kinds=kinds,
            key_id=settings.FENCELINE["WEBHOOK_SIGNING_KEY_ID"],
            created_at=now,
            updated_at=now,
        )
    else:
        changed = existing.target != target
        PersonalRoute.objects.filter(pk=existing.pk).update(
            target=target,
            kinds=kinds,
            updated_at=now,
            enabled=True,
            **({"key_version": F("key_version") + 1} if changed else {}),
        )
        route = PersonalRoute.objects.get(pk=existing.pk)
        if not changed:
            return RouteSaved(route=route, secret="")
    return RouteSaved(route=route, secret="" if target.startswith(MAILTO) else route_secret(route))
