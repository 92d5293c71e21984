"""gunicorn's threaded worker with every client socket operation bounded in time.

``console/gunicorn_conf.py`` names :class:`ThreadWorker` as the worker class. gunicorn's
``gthread`` worker already keeps its main thread free (it accepts, polls kept-alive
connections and reports to the arbiter), and reads each request in a pool thread, so a
client that stalls mid-request holds one thread, not the worker. But it reads from a blocking
socket without a timeout: a stalled client holds its thread until it goes away, and as many
stalled clients as threads stop the worker answering anyone. Here each read and write on a
client socket waits at most ``CLIENT_IO_TIMEOUT_S``. A request line or headers that stop
arriving are taken as the client having gone (end of stream: gunicorn closes the connection
as for a client that disconnected, without a traceback per slow client). A body that stops
arriving is an error the application sees (Django's ``UnreadablePostError``), never a short
body taken for the whole: a console form is refused by the CSRF check (403), the API answers
400, and nothing is written from half a request.
"""

from __future__ import annotations

import socket
from typing import Any

from gunicorn.workers import gthread  # type: ignore[import-untyped]

# Seconds one read or write on a client socket may wait (docs/production.md, "gunicorn").
CLIENT_IO_TIMEOUT_S = 5.0


class BoundedSocket(socket.socket):
    """A client socket whose blocking mode has a timeout; a read that times out is the end of
    the stream while the request's head is read, and raises while its body is."""

    reading_body = False

    def setblocking(self, flag: bool) -> None:
        if flag:
            self.settimeout(CLIENT_IO_TIMEOUT_S)
        else:
            super().setblocking(False)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        try:
            return super().recv(bufsize, flags)
        except TimeoutError:
            if self.reading_body:
                raise
            return b""

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError:
            if self.reading_body:
                raise
            return 0

    @classmethod
    def adopt(cls, sock: socket.socket) -> BoundedSocket:
        """The same connection as ``sock`` (which is detached), bounded."""
        bounded = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        bounded.settimeout(CLIENT_IO_TIMEOUT_S)
        return bounded


class ThreadWorker(gthread.ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker; a new connection's socket is bounded before it is read."""

    def handle(self, conn: Any) -> Any:
        """One request of ``conn`` (gunicorn calls this once per request, in a pool thread)."""
        if not conn.initialized and not isinstance(conn.sock, BoundedSocket):
            conn.sock = BoundedSocket.adopt(conn.sock)
        if isinstance(conn.sock, BoundedSocket):
            conn.sock.reading_body = False
        return super().handle(conn)

    def handle_request(self, req: Any, conn: Any) -> Any:
        """The request's head is in; from here a stalled read is the application's error."""
        if isinstance(conn.sock, BoundedSocket):
            conn.sock.reading_body = True
        return super().handle_request(req, conn)
