"""A sandbox payments provider for the fleet simulator: a small HTTP service that honours
idempotency keys the way a real payments API does, and can be told to misbehave.

    POST /v1/charges            Idempotency-Key: <key>   {"amount_cents": 1200, "customer": "c:1"}
        201 {"id": "ch_17", ...}                         a new charge
        200 {"id": "ch_17", ..., "replayed": true}       the same key again: the same charge
    GET  /v1/charges?idempotency_key=<key>               200 the charge, or 404: never made
    GET  /v1/charges/<id>                                200 the charge by its id, or 404
    GET  /v1/stats                                       what happened, for the final report

Lookups (the two GETs on charges) are what a reconciler asks (``sandbox-payments`` in
settings). The provider can be told, through its Python API or over HTTP, to

    lose a record    POST /v1/_sandbox/lose {"idempotency_key": k}: the charge stays made, but
                     a lookup by that key answers 404 (as a provider that forgot the key)
    answer lookups   POST /v1/_sandbox/lookups {"mode": "normal" | "cannot_tell" | "pending" |
                     "down"}: 200 {"status": "unknown"}, 200 {"status": "pending"}, or 503

A request may ask for a fault with ``Sandbox-Fault: drop | slow | fail``, and the provider
draws faults on its own with the probabilities it was started with:

    drop  the charge is made, then the connection closes without an answer (the caller
          cannot know: its outcome is UNKNOWN until someone looks the key up)
    slow  the answer comes after ``slow_s`` seconds
    fail  503 before anything is made (the caller knows nothing happened)

No Django import: it runs in a thread of ``manage.py simulate`` or on its own
(``python -m console.simulation.provider 8766``).
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

FAULTS = ("drop", "slow", "fail")
LOOKUP_MODES = ("normal", "cannot_tell", "pending", "down")


@dataclass
class Ledger:
    """The provider's own books: charges by idempotency key, and what it was asked."""

    charges: dict[str, dict[str, Any]] = field(default_factory=dict)
    lost_keys: set[str] = field(default_factory=set)
    lookups: int = 0
    requests_by_key: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULTS, 0))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, *, key: str = "", charge_id: str = "") -> dict[str, Any] | None:
        with self.lock:
            self.lookups += 1
            if key:
                return None if key in self.lost_keys else self.charges.get(key)
            return next((c for c in self.charges.values() if c["id"] == charge_id), None)

    def charge(self, key: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        with self.lock:
            self.requests_by_key[key] = self.requests_by_key.get(key, 0) + 1
            existing = self.charges.get(key)
            if existing is not None:
                return existing, False
            made = {
                "id": f"ch_{len(self.charges) + 1}",
                "idempotency_key": key,
                "amount_cents": body.get("amount_cents"),
                "customer": body.get("customer"),
                "status": "succeeded",
                "created_at": time.time(),
            }
            self.charges[key] = made
            return made, True

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "charges": len(self.charges),
                "requests": sum(self.requests_by_key.values()),
                "replayed_keys": sum(1 for n in self.requests_by_key.values() if n > 1),
                "lookups": self.lookups,
                "faults": dict(self.faults),
            }


class SandboxProvider:
    """The provider, served on ``127.0.0.1:port`` (0: a free port) in a daemon thread."""

    def __init__(
        self,
        *,
        port: int = 0,
        drop: float = 0.0,
        slow: float = 0.0,
        fail: float = 0.0,
        slow_s: float = 2.0,
        cannot_tell: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.ledger = Ledger()
        self.lookup_mode = "normal"  # or LOOKUP_MODES: how lookups answer
        self.cannot_tell = cannot_tell  # share of keys whose lookups always answer "cannot tell"
        self.cannot_tell_keys: set[str] = set()  # and these keys
        self.odds = {"drop": drop, "slow": slow, "fail": fail}
        self.slow_s = slow_s
        # A webhook sink (POST /v1/webhooks): what Fenceline's notifications delivered, and
        # whether each came signed; "fail" makes it answer 500 (POST /v1/_sandbox/webhooks).
        self.webhooks: list[dict[str, Any]] = []
        self.webhook_mode = "normal"
        self.random = random.Random(seed)  # noqa: S311 - fault injection, not security
        self.server = ProviderServer(port, self)
        self.thread = threading.Thread(target=self.server.serve_forever, name="sandbox-provider", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> SandboxProvider:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def cannot_tell_about(self, key: str) -> bool:
        """The same answer for a key every time: a share of keys the provider cannot tell about."""
        if key in self.cannot_tell_keys:
            return True
        if not key or not self.cannot_tell:
            return False
        return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 1000 < self.cannot_tell * 1000

    def lose(self, key: str) -> None:
        """Forget the idempotency key of a charge: lookups by that key answer 404."""
        with self.ledger.lock:
            self.ledger.lost_keys.add(key)

    def fault_for(self, asked: str) -> str:
        if asked in FAULTS:
            return asked
        draw = self.random.random()
        for name in FAULTS:
            if draw < self.odds[name]:
                return name
            draw -= self.odds[name]
        return ""


class ProviderServer(ThreadingHTTPServer):
    """The HTTP server of one SandboxProvider: its handlers read the provider from here."""

    daemon_threads = True

    def __init__(self, port: int, provider: SandboxProvider) -> None:
        self.provider = provider
        super().__init__(("127.0.0.1", port), SandboxHandler)

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        """A caller that hung up (a client's timeout, the demo's dropped answers) is not an
        error of the provider's: only anything else is printed, as the server would."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class SandboxHandler(BaseHTTPRequestHandler):
    """One request to the provider (the routes in the module's docstring)."""

    protocol_version = "HTTP/1.1"

    @property
    def provider(self) -> SandboxProvider:
        server = self.server
        if not isinstance(server, ProviderServer):
            raise TypeError("a SandboxHandler serves a ProviderServer")
        return server.provider

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the simulator shows progress
        return

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/v1/stats":
            return self._answer(200, self.provider.ledger.stats())
        if url.path == "/v1/webhooks":
            return self._answer(200, {"received": self.provider.webhooks})
        if url.path == "/v1/charges" or url.path.startswith("/v1/charges/"):
            return self._lookup(url.path, parse_qs(url.query).get("idempotency_key", [""])[0])
        return self._answer(404, {"error": "not_found"})

    def _lookup(self, path: str, key: str) -> None:
        provider = self.provider
        mode = provider.lookup_mode
        if mode == "down":
            return self._answer(503, {"error": "provider_unavailable"})
        charge_id = path.removeprefix("/v1/charges").strip("/")
        if not (key or charge_id):
            return self._answer(400, {"error": "look up by idempotency_key or by id"})
        found = provider.ledger.find(key=key, charge_id=charge_id)
        if mode == "cannot_tell" or provider.cannot_tell_about(key or (found or {}).get("idempotency_key", "")):
            return self._answer(200, {"status": "unknown"})
        if found is None:
            return self._answer(404, {"error": "no_such_charge"})
        if mode == "pending":
            return self._answer(200, {**found, "status": "pending"})
        return self._answer(200, found)

    def _webhook(self, body: object) -> None:
        provider = self.provider
        if provider.webhook_mode == "fail":
            return self._answer(500, {"error": "sink_failing"})
        fenceline = body.get("fenceline", {}) if isinstance(body, dict) else {}
        provider.webhooks.append(
            {
                "delivery_id": self.headers.get("Fenceline-Webhook-Id", ""),
                "signed": self.headers.get("Fenceline-Signature", "").startswith("t="),
                "kind": fenceline.get("kind", "") if isinstance(fenceline, dict) else "",
            }
        )
        return self._answer(200, {"ok": True})

    def do_POST(self) -> None:
        path = urlparse(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self._answer(400, {"error": "invalid_json"})
        if path.startswith("/v1/_sandbox/") and self._control(path, body):
            return None
        if path == "/v1/webhooks":
            return self._webhook(body)
        if path != "/v1/charges":
            return self._answer(404, {"error": "not_found"})
        return self._charge(body)

    def _control(self, path: str, body: object) -> bool:
        """The sandbox's own switches (lose a record, how lookups and the webhook sink
        answer); False when ``path`` and ``body`` name none of them."""
        provider = self.provider
        if not isinstance(body, dict):
            return False
        if path == "/v1/_sandbox/lose" and body.get("idempotency_key"):
            provider.lose(str(body["idempotency_key"]))
            self._answer(200, {"lost": body["idempotency_key"]})
        elif path == "/v1/_sandbox/lookups" and body.get("mode") in LOOKUP_MODES:
            provider.lookup_mode = body["mode"]
            self._answer(200, {"mode": provider.lookup_mode})
        elif path == "/v1/_sandbox/webhooks" and body.get("mode") in ("normal", "fail"):
            provider.webhook_mode = body["mode"]
            self._answer(200, {"mode": provider.webhook_mode})
        else:
            return False
        return True

    def _charge(self, body: object) -> None:
        """POST /v1/charges: a charge made once per idempotency key, with the fault the
        request asked for or the provider drew."""
        provider = self.provider
        key = self.headers.get("Idempotency-Key", "")
        if not key or not isinstance(body, dict):
            return self._answer(400, {"error": "an Idempotency-Key header and a JSON object are required"})
        fault = provider.fault_for(self.headers.get("Sandbox-Fault", ""))
        if fault:
            with provider.ledger.lock:
                provider.ledger.faults[fault] += 1
        if fault == "fail":
            return self._answer(503, {"error": "provider_unavailable"})
        charge, created = provider.ledger.charge(key, body)
        if fault == "drop":  # made, but the answer never arrives
            self.close_connection = True
            self.connection.close()
            return None
        if fault == "slow":
            time.sleep(provider.slow_s)
        return self._answer(201 if created else 200, {**charge, "replayed": not created})


if __name__ == "__main__":
    served = SandboxProvider(port=int(sys.argv[1]) if len(sys.argv) > 1 else 8766).start()
    print(f"sandbox provider at {served.url}", flush=True)
    served.thread.join()
