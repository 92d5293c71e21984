"""Django's PostgreSQL backend, with two additions.

Its connection health check is taken only when it can matter. With persistent connections
(``DB_CONN_MAX_AGE``, on by default), Django's health check (``CONN_HEALTH_CHECKS``) sends
``SELECT 1`` before the first query of every request: a round trip and a transaction per
request, about a tenth of what a worker API call costs (docs/performance.md). A connection
dies while it waits — the server restarted, a proxy or firewall dropped it as idle — so here
the check is taken by a connection that has not been used for ``HEALTH_CHECK_IDLE_S``
seconds, and skipped by one busy serving request after request. A connection that fails in
between still fails one request, after which Django closes it (``errors_occurred``) and the
next request opens a new one.

With ``DATABASE_URL`` unset the settings name an embedded data directory
(``EMBEDDED_DATA_DIR``): the first connection of a process starts that server
(console/postgresql/embedded.py) and connects through its socket.
"""

import time
from typing import Any

from django.db.backends.postgresql import base

from console.postgresql import embedded

HEALTH_CHECK_IDLE_S = 5.0


class DatabaseWrapper(base.DatabaseWrapper):
    _last_seen: float | None = None

    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        data_dir = self.settings_dict.get("EMBEDDED_DATA_DIR")
        if data_dir:
            params["host"] = embedded.socket_dir(data_dir, self.settings_dict["NAME"])
        return params

    def close_if_unusable_or_obsolete(self) -> None:
        # Called as each request starts and ends: the gap between the two calls is the idle time.
        now = time.monotonic()
        recently = self._last_seen is not None and now - self._last_seen < HEALTH_CHECK_IDLE_S
        self._last_seen = now
        super().close_if_unusable_or_obsolete()
        if recently and self.connection is not None:
            self.health_check_done = True  # busy a moment ago: no SELECT 1 before this request
