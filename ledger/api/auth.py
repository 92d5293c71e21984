"""The one authentication class of the worker API: a bearer token sets request.worker; a
token that matches no worker counts against the client's address (429 past the limit,
``ledger/services/fleet/token_failures.py``)."""

import ipaddress
from typing import cast

from django.conf import settings
from django.http import HttpRequest
from ninja.security import HttpBearer

from ledger.models import Worker
from ledger.selectors import worker_for_token
from ledger.services.fleet.token_failures import token_failed


def client_address(request: HttpRequest) -> str:
    """The address a request came from, for throttling (worker tokens here, console sign-ins
    through django-axes' ``AXES_CLIENT_IP_CALLABLE``): ``REMOTE_ADDR``; behind the declared TLS
    proxy (``FENCELINE_BEHIND_TLS_PROXY=1``, which alone can reach gunicorn) the last
    ``X-Forwarded-For`` entry, the one that proxy appended, when it is an address."""
    remote = str(request.META.get("REMOTE_ADDR") or "")
    if settings.BEHIND_TLS_PROXY:
        forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR") or "").rsplit(",", 1)[-1].strip()
        try:
            return str(ipaddress.ip_address(forwarded))
        except ValueError:
            pass
    return remote


class WorkerRequest(HttpRequest):
    """A request :class:`WorkerBearer` let in: what every view of the worker API receives."""

    worker: Worker


class WorkerBearer(HttpBearer):
    openapi_scheme = "bearer"

    def authenticate(self, request: HttpRequest, token: str) -> Worker | None:
        worker = worker_for_token(token) if token and len(token) <= 200 else None
        if worker is None:
            token_failed(address=client_address(request))  # raises TooManyRequests past the limit
            return None
        cast(WorkerRequest, request).worker = worker
        return worker
