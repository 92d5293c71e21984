"""A provider fake's plumbing: a ThreadingHTTPServer on a free loopback port in a thread, the
requests it saw, a required credential header, and throttling on demand."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Seen:
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class FakeProvider:
    """Subclasses answer ``route(path, query) -> Reply``."""

    auth_header = "Authorization"

    def __init__(self, *, credential: str) -> None:
        self.credential = credential  # the header value a request must carry
        self.seen: list[Seen] = []
        self.throttle: list[Reply] = []  # replies given, in order, before any real answer
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                seen = Seen(parts.path, parse_qs(parts.query), dict(self.headers.items()))
                with fake.lock:
                    fake.seen.append(seen)
                    throttled = fake.throttle.pop(0) if fake.throttle else None
                if throttled is not None:
                    reply = throttled
                elif self.headers.get(fake.auth_header) != fake.credential:
                    reply = fake.unauthorized()
                else:
                    reply = fake.route(seen.path, seen.query)
                self._send(reply)

            def _send(self, reply: Reply) -> None:
                body = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeProvider:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def route(self, path: str, query: dict[str, list[str]]) -> Reply:
        raise NotImplementedError

    def unauthorized(self) -> Reply:
        return Reply(401, {"message": "Requires authentication"})

    def pages(self, items: list[Any], size: int, start: int) -> tuple[list[Any], int | None]:
        """Items ``start..start+size`` and the next start (None: the last page)."""
        following = start + size
        return items[start:following], following if following < len(items) else None
