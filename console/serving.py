"""gunicorn's threaded worker with every client socket operation bounded in time.

``console/gunicorn_conf.py`` names :class:`ThreadWorker` as the worker class. gunicorn's
``gthread`` worker already keeps its main thread free (it accepts, polls kept-alive
connections and reports to the arbiter), and reads each request in a pool thread, so a
client that stalls mid-request holds one thread, not the worker. But it reads from a blocking
socket without a timeout: a stalled client holds its thread until it goes away, and as many
stalled clients as threads stop the worker answering anyone. Here each read and write on a
client socket waits at most ``CLIENT_IO_TIMEOUT_S``; a read that times out is taken as the
client having gone (end of stream), so gunicorn closes the connection as it does for a client
that disconnected, without a traceback per slow client, and a body cut short is what Django
and the API already refuse (403 for a console form without its CSRF token, 400 for JSON).
"""

from __future__ import annotations

import socket
from typing import Any

from gunicorn.workers import gthread  # type: ignore[import-untyped]

# Seconds one read or write on a client socket may wait (docs/production.md, "gunicorn").
CLIENT_IO_TIMEOUT_S = 5.0


class BoundedSocket(socket.socket):
    """A client socket whose blocking mode has a timeout, and whose read timeout is an EOF."""

    def setblocking(self, flag: bool) -> None:
        if flag:
            self.settimeout(CLIENT_IO_TIMEOUT_S)
        else:
            super().setblocking(False)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        try:
            return super().recv(bufsize, flags)
        except TimeoutError:
            return b""

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError:
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
        if not conn.initialized and not isinstance(conn.sock, BoundedSocket):
            conn.sock = BoundedSocket.adopt(conn.sock)
        return super().handle(conn)
