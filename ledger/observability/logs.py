"""One JSON line per request and per job.

The console handler (console/settings.py, ``FENCELINE_LOG_FORMAT=json``, the default) writes
every record as one JSON object: time, level, logger, message and the record's extra fields.
The request line (``fenceline.request``) carries request_id, method, route (the URL pattern,
never the path), status, code (the API's error code), duration_ms, tenant, worker, run and
operation; the job line (``fenceline.job``) carries job, outcome, duration_ms and the job's
counts. Both pass the secret filters of ledger/logfilter.py first: an extra field with a
credential-like value is withheld like a message.
"""

import re
import uuid
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from ledger.boundary import credential_kind

# A caller's X-Request-ID is kept when it looks like an id; anything else is replaced.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id(presented: str | None) -> str:
    """The caller's X-Request-ID when it looks like an id and not like a credential (it is
    logged and answered back), else a new one."""
    if presented and _REQUEST_ID.fullmatch(presented) and credential_kind(presented, remember=False) is None:
        return presented
    return uuid.uuid4().hex


class JsonLines(JsonFormatter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:  # JsonFormatter's options, passed on
        kwargs.setdefault("rename_fields", {"levelname": "level", "name": "logger"})
        kwargs.setdefault("json_ensure_ascii", False)
        kwargs.setdefault("timestamp", "time")  # ISO 8601 in UTC
        super().__init__("%(levelname)s %(name)s %(message)s", *args, **kwargs)
