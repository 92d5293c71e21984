"""Failed worker-token authentications are throttled per client address.

Every request whose bearer token matches no worker counts one failure for its client address
(``ledger.api.auth.client_address``) in a fixed window shared by every process (a row per
address in PostgreSQL). Past ``TOKEN_FAILURE_LIMIT`` failures within ``TOKEN_FAILURE_WINDOW_S``
the address's failed attempts answer 429 ``TOO_MANY_REQUESTS`` with ``Retry-After`` (the rest
of the window) instead of 401, counted in ``fenceline_throttled_requests{kind="worker_token"}``.

Only failures are throttled: a valid token keeps working from a throttled address. Tokens are
256-bit random values, so the throttle has no guessable secret to protect; what it stops is a
flood of wrong tokens, and a misconfigured or hostile client on a shared address (a NAT, a
proxy) cannot lock the healthy workers behind that address out. A successful request costs
nothing: the window is read and written only when a token fails.
"""

import math
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from ledger.errors import TooManyRequests
from ledger.observability.metrics import THROTTLED
from ledger.sql.throttle import count_failure


def token_failed(*, address: str) -> None:
    """Count one failed token from ``address``; raise :class:`TooManyRequests` past the limit."""
    limit = settings.FENCELINE["TOKEN_FAILURE_LIMIT"]
    window = timedelta(seconds=settings.FENCELINE["TOKEN_FAILURE_WINDOW_S"])
    now = timezone.now()
    failures, started = count_failure(address=address, now=now, window_starts_after=now - window)
    if failures <= limit:
        return
    THROTTLED.labels(kind="worker_token").inc()
    retry_after_s = max(1, math.ceil((started + window - now).total_seconds()))
    raise TooManyRequests("too many failed worker tokens from this address", retry_after_s=retry_after_s)
