"""The one authentication class of the worker API: a bearer token sets request.worker."""

from typing import cast

from django.http import HttpRequest
from ninja.security import HttpBearer

from ledger.models import Worker
from ledger.selectors import worker_for_token


class WorkerRequest(HttpRequest):
    """A request :class:`WorkerBearer` let in: what every view of the worker API receives."""

    worker: Worker


class WorkerBearer(HttpBearer):
    openapi_scheme = "bearer"

    def authenticate(self, request: HttpRequest, token: str) -> Worker | None:
        if not token or len(token) > 200:
            return None
        worker = worker_for_token(token)
        if worker is None:
            return None
        cast(WorkerRequest, request).worker = worker
        return worker
