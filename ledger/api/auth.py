"""The one authentication class of the worker API: a bearer token sets request.worker."""

from ninja.security import HttpBearer

from ledger.selectors import worker_for_token


class WorkerBearer(HttpBearer):
    openapi_scheme = "bearer"

    def authenticate(self, request, token: str):
        if not token or len(token) > 200:
            return None
        worker = worker_for_token(token)
        if worker is None:
            return None
        request.worker = worker
        return worker
