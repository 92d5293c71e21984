"""The production server in a test: gunicorn serving the project on a free port of loopback,
against the test database through a TCP path the test can cut (a database that goes away and
comes back), with the environment a test gives it (a broker nobody answers, say).

gunicorn runs from the checkout, so it reads the project's ``gunicorn.conf.py`` there, if there is
one, as production does; the command line adds only the address, the number of workers and no
control socket (several servers may run on one machine)."""

import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import requests
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class CuttableProxy:
    """A TCP forwarder from a local port to ``upstream``. ``cut()`` closes every connection
    through it and stops listening (a client then gets "connection refused", a connected one
    "server closed the connection"); ``restore()`` listens again on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            doomed, self._sockets = self._sockets, set()
        for sock in [listener, *doomed]:
            if sock is None:
                continue
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets |= {client, server}
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(a, selectors.EVENT_READ, b)
            selector.register(b, selectors.EVENT_READ, a)
            while True:
                try:
                    for key, _ in selector.select():
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            raise OSError("closed")
                        key.data.sendall(data)
                except (OSError, ValueError):
                    break
        for sock in (a, b):
            with self._lock:
                self._sockets.discard(sock)
            sock.close()

    def close(self) -> None:
        self.cut()


class Gunicorn:
    """gunicorn serving the project on a free port of loopback."""

    def __init__(self, *, env: dict[str, str], workers: int = 2, config: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        command = [
            str(Path(sys.executable).with_name("gunicorn")),
            "console.wsgi:application",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
            "--no-control-socket",
            *(["-c", config] if config else []),  # "python:console.gunicorn_conf": production's
        ]
        self.process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited: {self.output()[-2000:]}")
            try:
                if requests.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"gunicorn did not answer within {timeout_s} s: {self.output()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.log.close()


@contextmanager
def served(*, database_port: int = 5432, workers: int = 2, **extra_env: str):
    """gunicorn against this test's database (committed data: a ``transaction=True`` test),
    reached at 127.0.0.1:``database_port``."""
    settings = connection.settings_dict
    assert settings["NAME"].startswith("test_"), settings["NAME"]
    user = settings["USER"] or "postgres"
    password = f":{settings['PASSWORD']}" if settings["PASSWORD"] else ""
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{user}{password}@127.0.0.1:{database_port}/{settings['NAME']}",
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "FENCELINE_LOG_FORMAT": "plain",
        **extra_env,
    }
    server = Gunicorn(env=env, workers=workers)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
