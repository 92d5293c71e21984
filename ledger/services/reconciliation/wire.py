"""One way to ask a provider's HTTP API, for every HTTP reconciler (``http`` and the provider
adapters): the credential's header resolved at call time, a bounded answer, and flow control.

A throttled answer (429, or whatever the adapter's ``throttled`` reads as one, e.g. GitHub's
403 with ``x-ratelimit-remaining: 0``) is asked again after the wait the provider names
(``Retry-After`` in seconds or as an HTTP date; else 1 s, 2 s, ...), at most ``retries`` times
and only while each wait is at most ``max_wait_s``. Still throttled, or told to wait longer,
the lookup raises :class:`ProviderUnavailable` with ``retry_after_s``: the lookup job then
asks again no sooner than that (``approvals/services/lookups.py``), as for any provider that
does not answer, and hands the case to people when its attempts are spent.

5xx, a timeout or a refused connection raise ProviderUnavailable at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import unquote_plus, urlencode, urlsplit

import requests
from django.core.exceptions import ImproperlyConfigured

from ledger.services.reconciliation.credentials import CredentialRef
from ledger.services.reconciliation.protocol import ProviderUnavailable, digest

MAX_ANSWER_BYTES = 256 * 1024
WIRE_DEFAULTS: dict[str, Any] = {"timeout_s": 5, "retries": 2, "max_wait_s": 10}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes
    asked: str  # "GET /path?query", for the evidence: the lookup values, never a header

    @property
    def digest(self) -> str:
        return digest(self.body)


def retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), or None."""
    raw = (headers.get("Retry-After") or "").strip()
    if not raw:
        return None
    if raw.isdigit():
        return float(raw)
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def throttled_by_429(answer: Answer) -> tuple[bool, float | None]:
    """(throttled?, seconds asked for) of a plain HTTP API: a 429 and its Retry-After."""
    return answer.status == 429, retry_after(answer.headers) if answer.status == 429 else None


class Wire:
    """A provider's HTTP API as one reconciler asks it."""

    def __init__(
        self,
        name: str,
        base_url: Any,
        *,
        credential: CredentialRef | None,
        options: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        throttled: Callable[[Answer], tuple[bool, float | None]] = throttled_by_429,
    ) -> None:
        if not isinstance(base_url, str) or urlsplit(base_url).scheme not in ("http", "https"):
            raise ImproperlyConfigured(f"reconciler {name!r}: base_url must be an http(s) URL")
        for key in WIRE_DEFAULTS:
            value = options.get(key, WIRE_DEFAULTS[key])
            if type(value) not in (int, float) or value < 0:
                raise ImproperlyConfigured(f"reconciler {name!r}: {key} must be a number >= 0")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.base_path = urlsplit(self.base_url).path
        self.credential = credential
        self.timeout_s = float(options.get("timeout_s", WIRE_DEFAULTS["timeout_s"]))
        self.retries = int(options.get("retries", WIRE_DEFAULTS["retries"]))
        self.max_wait_s = float(options.get("max_wait_s", WIRE_DEFAULTS["max_wait_s"]))
        self.headers = {"User-Agent": "fenceline-reconciler", **(headers or {})}
        self.throttled = throttled
        self.session = requests.Session()
        self.sleep: Callable[[float], None] = time.sleep

    def get(self, path: str, params: Mapping[str, str | int] | None = None) -> Answer:
        """GET ``path`` (below base_url) with ``params``; a full URL (a Link header's next page)
        is taken as it is when it is on the same host."""
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        if urlsplit(url).netloc != urlsplit(self.base_url).netloc:
            raise ProviderUnavailable(f"{self.name}: the provider pointed to another host")
        if params:
            url += ("&" if "?" in url else "?") + urlencode(params)
        parts = urlsplit(url)
        asked = f"GET {parts.path}" + (f"?{unquote_plus(parts.query)}" if parts.query else "")
        for attempt in range(self.retries + 1):
            answer = self._once(url, asked)
            throttled, wait = self.throttled(answer)
            if not throttled:
                if answer.status >= 500:
                    raise ProviderUnavailable(f"{self.name}: status {answer.status}")
                return answer
            wait = float(2**attempt) if wait is None else wait
            if attempt == self.retries or wait > self.max_wait_s:
                raise ProviderUnavailable(
                    f"{self.name}: throttled (status {answer.status}), asked to wait {wait:.0f} s",
                    retry_after_s=wait,
                )
            self.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, url: str, asked: str) -> Answer:
        headers = dict(self.headers)
        if self.credential is not None:
            headers.update(self.credential.headers())  # resolved now, dropped with the request
        try:
            response = self.session.get(url, headers=headers, timeout=self.timeout_s, allow_redirects=False)
        except requests.Timeout:
            raise ProviderUnavailable(f"{self.name}: no answer within {self.timeout_s:g} s") from None
        except requests.RequestException as exc:
            raise ProviderUnavailable(f"{self.name}: {type(exc).__name__}") from None
        finally:
            headers.clear()
        return Answer(response.status_code, response.headers, response.content[:MAX_ANSWER_BYTES], asked)
