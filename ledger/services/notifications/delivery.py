"""Sending deliveries: claim due PENDING ones (SELECT ... FOR UPDATE SKIP LOCKED, then a
``claimed_until`` lease), send them OUTSIDE any transaction, a few at once, each with a short
timeout, then record each answer with a conditional UPDATE on the claim:

| answer                                   | then                                               |
|------------------------------------------|----------------------------------------------------|
| 2xx                                      | DELIVERED                                          |
| 5xx, 408, 429, timeout, connection       | again after base x 2^(n-1) s (capped, jittered);   |
| target or signing key not configured     | GAVE_UP once WEBHOOK_MAX_ATTEMPTS are spent        |
| any other 3xx / 4xx (a redirect included)| GAVE_UP at once                                    |
| a host that is not public ("refused_address", addresses.py) | GAVE_UP at once, nothing sent |

Recorded per attempt: the status code and a short error class ("timeout", "http_500"),
never the response (it is not even read) nor an exception's message. A refused address is
refused before any connection, so the record says nothing of what answers there. Two passes at once
claim different deliveries; a pass that dies leaves its claim to lapse, after which another
pass sends the delivery again (at least once: receivers dedupe on Fenceline-Webhook-Id)."""

import json
import logging
import math
import random
import smtplib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import requests
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ledger.models import PersonalRoute, WebhookDelivery
from ledger.models.notifications import DeliveryStatus
from ledger.services.notifications.addresses import REFUSED, AddressRefused, ConnectRefused, host_check, session_for
from ledger.services.notifications.routes import MAILTO, route_secret
from ledger.services.notifications.targets import (
    SigningKeyMissing,
    signature,
    signing_secret,
    target_url,
    url_parts,
)

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429})
USER_AGENT = "Fenceline-Webhooks/1"


@dataclass
class DeliveryPass:
    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    gave_up: int = 0


@dataclass(frozen=True)
class Attempt:
    status_code: int | None
    error: str  # "" on success
    retry: bool


@dataclass(frozen=True)
class Prepared:
    delivery: WebhookDelivery
    url: str | None
    secret: str | None
    error: str  # why it cannot be sent, or ""


def backoff_s(attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones."""
    base: int = settings.FENCELINE["WEBHOOK_BACKOFF_BASE_S"]
    cap: int = settings.FENCELINE["WEBHOOK_BACKOFF_MAX_S"]
    delay: int = min(cap, base * 2 ** max(0, attempts - 1))
    return min(cap, delay * random.uniform(0.8, 1.2))  # noqa: S311 - jitter, not security


def claim_s() -> int:
    """How long a claim lasts: every send of a full batch, at the concurrency, could time out
    twice (connect, then read), and some room to record."""
    fl = settings.FENCELINE
    rounds: int = math.ceil(fl["WEBHOOK_DELIVERY_BATCH_SIZE"] / fl["WEBHOOK_CONCURRENCY"])
    timeout_s: int = fl["WEBHOOK_TIMEOUT_S"]
    return rounds * 2 * timeout_s + 30


def body_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def _claim(limit: int, *, now: datetime) -> tuple[list[WebhookDelivery], datetime]:
    claimed_until = now + timedelta(seconds=claim_s())
    with transaction.atomic():
        rows = list(
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("endpoint", "route")
            .filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
            .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            .order_by("next_attempt_at")[:limit]
        )
        WebhookDelivery.objects.filter(pk__in=[row.pk for row in rows]).update(claimed_until=claimed_until)
    for row in rows:
        row.claimed_until = claimed_until
    return rows, claimed_until


def _prepare_route(delivery: WebhookDelivery, route: PersonalRoute) -> Prepared:
    """A person's own route: an email address (no secret), or a URL signed as an endpoint is."""
    if not route.enabled:
        return Prepared(delivery, None, None, "disabled")
    if route.target.startswith(MAILTO):
        return Prepared(delivery, route.target, "", "")
    try:
        secret = route_secret(route)
    except SigningKeyMissing:
        return Prepared(delivery, None, None, "signing_key")
    return Prepared(delivery, target_url(route.target), secret, "")


def _prepare(delivery: WebhookDelivery) -> Prepared:
    if delivery.route is not None:
        return _prepare_route(delivery, delivery.route)
    endpoint = delivery.endpoint
    if endpoint is None:
        return Prepared(delivery, None, None, "target_unset")
    if not endpoint.enabled:
        return Prepared(delivery, None, None, "disabled")
    url = target_url(endpoint.target)
    if url is None:
        return Prepared(delivery, None, None, "target_unset")
    try:
        secret = signing_secret(endpoint_id=endpoint.pk, key_id=endpoint.key_id, key_version=endpoint.key_version)
    except SigningKeyMissing:
        return Prepared(delivery, None, None, "signing_key")
    return Prepared(delivery, url, secret, "")


def _send(prepared: Prepared, url: str, secret: str) -> requests.Response:
    """POST the delivery to ``url`` (a host checked again now, then connected to as
    ``session_for`` says), never following a redirect; the answer's body is left unread."""
    scheme, host, port = url_parts(url) or ("", "", 0)
    host_check(scheme, host, port)
    body = body_bytes(prepared.delivery.body)
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Fenceline-Webhook-Id": str(prepared.delivery.pk),
        "Fenceline-Signature": signature(secret, body, timestamp),
    }
    timeout = settings.FENCELINE["WEBHOOK_TIMEOUT_S"]
    with session_for(host, port) as session:
        return session.post(
            url, data=body, headers=headers, timeout=(timeout, timeout), allow_redirects=False, stream=True
        )


def _mail(delivery: WebhookDelivery, address: str) -> Attempt:
    """A route's email: the body's text and its console link, through Django's email
    backend (settings EMAIL_*); a failure is retried like a connection error."""
    body = delivery.body
    link = body.get("fenceline", {}).get("console_url", "")
    try:
        send_mail(
            subject=f"Fenceline: {body.get('text', '')}"[:150],
            message=f"{body.get('text', '')}\n\n{link}\n",
            from_email=None,
            recipient_list=[address],
        )
    except (smtplib.SMTPException, OSError):
        return Attempt(None, "email", retry=True)
    return Attempt(None, "", retry=False)


def _post(prepared: Prepared) -> Attempt:
    """One HTTP request (no database here: it runs in a pool thread)."""
    if prepared.error or prepared.url is None or prepared.secret is None:
        return Attempt(None, prepared.error or "target_unset", retry=prepared.error != "disabled")
    if prepared.url.startswith(MAILTO):
        return _mail(prepared.delivery, prepared.url.removeprefix(MAILTO))
    try:
        response = _send(prepared, prepared.url, prepared.secret)
    except (AddressRefused, ConnectRefused):
        return Attempt(None, REFUSED, retry=False)
    except requests.Timeout:
        return Attempt(None, "timeout", retry=True)
    except requests.ConnectionError:
        return Attempt(None, "connection", retry=True)
    except requests.RequestException:
        return Attempt(None, "request", retry=False)
    code = response.status_code
    response.close()  # the answer's body is never read
    if 200 <= code < 300:
        return Attempt(code, "", retry=False)
    return Attempt(code, f"http_{code}", retry=code >= 500 or code in RETRY_STATUSES)


def _record(delivery: WebhookDelivery, attempt: Attempt, *, claimed_until: datetime, now: datetime) -> str:
    """The attempt's outcome, if the claim is still ours; the status it left (or "")."""
    attempts = delivery.attempts + (0 if attempt.error == "disabled" else 1)
    values: dict[str, Any] = {"attempts": attempts, "last_status_code": attempt.status_code, "claimed_until": None}
    if not attempt.error:
        values.update(status=DeliveryStatus.DELIVERED, delivered_at=timezone.now(), last_error="")
    elif attempt.retry and attempts < settings.FENCELINE["WEBHOOK_MAX_ATTEMPTS"]:
        values.update(last_error=attempt.error, next_attempt_at=now + timedelta(seconds=backoff_s(attempts)))
    else:
        values.update(status=DeliveryStatus.GAVE_UP, last_error=attempt.error)
    won = WebhookDelivery.objects.filter(
        pk=delivery.pk, status=DeliveryStatus.PENDING, claimed_until=claimed_until
    ).update(**values)
    if not won:
        return ""
    if attempt.error:
        logger.info(
            "webhook delivery %s (endpoint %s, %s): attempt %d failed: %s",
            delivery.pk,
            delivery.endpoint_id or f"route:{delivery.route_id}",
            delivery.kind,
            attempts,
            attempt.error,
        )
    return str(values.get("status", DeliveryStatus.PENDING))


def deliveries_send(*, batch_size: int | None = None, now: datetime | None = None) -> DeliveryPass:
    """One bounded pass: claim at most ``batch_size`` due deliveries, send, record."""
    now = now or timezone.now()
    limit = batch_size or settings.FENCELINE["WEBHOOK_DELIVERY_BATCH_SIZE"]
    rows, claimed_until = _claim(limit, now=now)
    result = DeliveryPass(claimed=len(rows))
    if not rows:
        return result
    prepared = [_prepare(row) for row in rows]
    with ThreadPoolExecutor(max_workers=min(len(rows), settings.FENCELINE["WEBHOOK_CONCURRENCY"])) as pool:
        attempts = list(pool.map(_post, prepared))
    for row, attempt in zip(rows, attempts, strict=True):
        status = _record(row, attempt, claimed_until=claimed_until, now=now)
        if status == DeliveryStatus.DELIVERED:
            result.delivered += 1
        elif status == DeliveryStatus.GAVE_UP:
            result.gave_up += 1
        elif status == DeliveryStatus.PENDING:
            result.retrying += 1
    return result


def deliveries_due(*, now: datetime | None = None) -> int:
    """How many PENDING deliveries are due now (the ``notify --all`` loop's condition)."""
    now = now or timezone.now()
    return (
        WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .count()
    )
