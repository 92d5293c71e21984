"""A tenant's webhook endpoints, set by its admins: create, update, disable / enable, rotate
the signing secret. Each is a person's decision (invariant 8): a console ``user`` has their
admin role re-checked here, a command or test names the actor; each is an AdminAction.

Creating an endpoint and rotating its secret return the secret, to be shown once; it is
never stored (``targets.signing_secret`` derives it again when a delivery is signed)."""

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F

from ledger.actors import user_actor
from ledger.boundary import check_text
from ledger.errors import InvalidInput, NotFound
from ledger.models import Tenant, WebhookDelivery, WebhookEndpoint
from ledger.models.notifications import DeliveryStatus, NotificationKind
from ledger.roles import ADMINISTER
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.notifications.targets import REF_PREFIX, signing_secret, target_check

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}")
DEFAULT_UNKNOWN_AFTER_S = 900
MIN_UNKNOWN_AFTER_S = 60
MAX_UNKNOWN_AFTER_S = 7 * 86400


@dataclass(frozen=True)
class EndpointSecret:
    """An endpoint and its signing secret, returned once to be shown to the admin."""

    endpoint: WebhookEndpoint
    secret: str


def kinds_check(kinds: object) -> list[str]:
    if not isinstance(kinds, list | tuple) or not kinds:
        raise InvalidInput("choose at least one kind of notification", field="kinds")
    known = NotificationKind.values
    if not all(isinstance(k, str) and k in known for k in kinds):
        raise InvalidInput(f"kinds are among: {', '.join(known)}", field="kinds")
    return [k for k in known if k in kinds]  # the documented order, each once


def unknown_after_check(value: object) -> int:
    if type(value) is not int or not MIN_UNKNOWN_AFTER_S <= value <= MAX_UNKNOWN_AFTER_S:
        raise InvalidInput(
            f"unknown_after_s is a whole number of seconds from {MIN_UNKNOWN_AFTER_S} to {MAX_UNKNOWN_AFTER_S}",
            field="unknown_after_s",
        )
    return value


def name_check(name: object) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name.strip()):
        raise InvalidInput(
            "a name is 1-64 letters, digits, spaces, . _ - (starting with a letter or digit)", field="name"
        )
    check_text(name.strip(), path="name")
    return name.strip()


def _actor(*, tenant: Tenant, user: Any, name: str) -> str:
    acting = acting_name(user=user, name=name, tenant_id=tenant.pk, perm=ADMINISTER)
    if not acting:
        raise InvalidInput("a webhook change names who made it and why")
    return user_actor(acting)


def _target_fields(target: str) -> dict[str, str]:
    """What the admin record keeps of a target: a reference's name, or a URL's host."""
    if target.startswith(REF_PREFIX):
        return {"target_ref": target.removeprefix(REF_PREFIX)}
    return {"target_host": urlsplit(target).hostname or ""}


def _secret(endpoint: WebhookEndpoint) -> str:
    return signing_secret(endpoint_id=endpoint.pk, key_id=endpoint.key_id, key_version=endpoint.key_version)


@transaction.atomic
def endpoint_create(
    *,
    tenant: Tenant,
    name: str,
    target: str,
    kinds: Iterable[str],
    reason: str,
    unknown_after_s: int = DEFAULT_UNKNOWN_AFTER_S,
    user: Any = None,
    created_by: str = "",
) -> EndpointSecret:
    actor = _actor(tenant=tenant, user=user, name=created_by)
    reason = decision_reason(reason)
    values = {
        "name": name_check(name),
        "target": target_check(target),
        "kinds": kinds_check(list(kinds)),
        "unknown_after_s": unknown_after_check(unknown_after_s),
    }
    try:
        with transaction.atomic():
            endpoint = WebhookEndpoint.objects.create(
                tenant=tenant,
                key_id=settings.FENCELINE["WEBHOOK_SIGNING_KEY_ID"],
                created_by=actor,
                **values,
            )
    except IntegrityError:
        raise InvalidInput("this tenant already has a webhook of that name", field="name") from None
    admin_action_record(
        tenant=tenant,
        actor=actor,
        action="webhook.create",
        subject=f"webhook {endpoint.name}",
        reason=reason,
        fields={"endpoint_id": str(endpoint.pk), "kinds": endpoint.kinds, **_target_fields(endpoint.target)},
    )
    return EndpointSecret(endpoint=endpoint, secret=_secret(endpoint))


def _locked(*, tenant: Tenant, endpoint_id: uuid.UUID | str) -> WebhookEndpoint:
    try:
        return WebhookEndpoint.objects.select_for_update().get(tenant=tenant, pk=endpoint_id)
    except (WebhookEndpoint.DoesNotExist, ValueError, TypeError):
        raise NotFound("no such webhook on this tenant") from None


@transaction.atomic
def endpoint_update(
    *,
    tenant: Tenant,
    endpoint_id: uuid.UUID | str,
    reason: str,
    target: str | None = None,
    kinds: Iterable[str] | None = None,
    unknown_after_s: int | None = None,
    user: Any = None,
    changed_by: str = "",
) -> WebhookEndpoint:
    """Change what an endpoint is sent and where; a field left None stays as it is."""
    actor = _actor(tenant=tenant, user=user, name=changed_by)
    reason = decision_reason(reason)
    endpoint = _locked(tenant=tenant, endpoint_id=endpoint_id)
    changed: dict[str, Any] = {}
    if target is not None:
        changed["target"] = target_check(target)
    if kinds is not None:
        changed["kinds"] = kinds_check(list(kinds))
    if unknown_after_s is not None:
        changed["unknown_after_s"] = unknown_after_check(unknown_after_s)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(**changed)
    for field, value in changed.items():
        setattr(endpoint, field, value)
    recorded = {k: v for k, v in changed.items() if k != "target"}
    if "target" in changed:
        recorded.update(_target_fields(changed["target"]))
    admin_action_record(
        tenant=tenant,
        actor=actor,
        action="webhook.update",
        subject=f"webhook {endpoint.name}",
        reason=reason,
        fields={"endpoint_id": str(endpoint.pk), **recorded},
    )
    return endpoint


@transaction.atomic
def endpoint_set_enabled(
    *, tenant: Tenant, endpoint_id: uuid.UUID | str, enabled: bool, reason: str, user: Any = None, changed_by: str = ""
) -> WebhookEndpoint:
    """Disable (nothing more is made or sent for it; what was pending is given up) or enable."""
    actor = _actor(tenant=tenant, user=user, name=changed_by)
    reason = decision_reason(reason)
    endpoint = _locked(tenant=tenant, endpoint_id=endpoint_id)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(enabled=enabled)
    endpoint.enabled = enabled
    if not enabled:
        WebhookDelivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.GAVE_UP, last_error="disabled", claimed_until=None
        )
    admin_action_record(
        tenant=tenant,
        actor=actor,
        action="webhook.enable" if enabled else "webhook.disable",
        subject=f"webhook {endpoint.name}",
        reason=reason,
        fields={"endpoint_id": str(endpoint.pk)},
    )
    return endpoint


def endpoint_disable(**kwargs: Any) -> WebhookEndpoint:
    return endpoint_set_enabled(enabled=False, **kwargs)


def endpoint_enable(**kwargs: Any) -> WebhookEndpoint:
    return endpoint_set_enabled(enabled=True, **kwargs)


@transaction.atomic
def endpoint_rotate_secret(
    *, tenant: Tenant, endpoint_id: uuid.UUID | str, reason: str, user: Any = None, changed_by: str = ""
) -> EndpointSecret:
    """A new signing secret (the key version goes up, under the current signing key id): the
    old one signs nothing more, including retries of deliveries made before."""
    actor = _actor(tenant=tenant, user=user, name=changed_by)
    reason = decision_reason(reason)
    endpoint = _locked(tenant=tenant, endpoint_id=endpoint_id)
    key_id = settings.FENCELINE["WEBHOOK_SIGNING_KEY_ID"]
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(key_version=F("key_version") + 1, key_id=key_id)
    endpoint.refresh_from_db(fields=["key_version", "key_id"])
    admin_action_record(
        tenant=tenant,
        actor=actor,
        action="webhook.rotate_secret",
        subject=f"webhook {endpoint.name}",
        reason=reason,
        fields={"endpoint_id": str(endpoint.pk), "key_id": key_id, "key_version": endpoint.key_version},
    )
    return EndpointSecret(endpoint=endpoint, secret=_secret(endpoint))
