"""Slow clients against the production server: K connections that stall, /healthz meanwhile.

A benchmark, not a test: pytest never collects this file (tests/ops/test_slow_clients.py is
the CI test). The server is started exactly as docs/production.md documents, through
``make serve`` (``SERVE_ADDR`` on a free loopback port), or by any other command given with
``--command`` (``{addr}`` is replaced by the address), e.g. the old documented sync workers:

    .venv/bin/python tests/bench/slow_clients.py --stalled 4,16,64
    .venv/bin/python tests/bench/slow_clients.py --stalled 4,16,64 \\
        --command '.venv/bin/gunicorn console.wsgi:application --bind {addr} --workers 4 --worker-class sync'

Per round, K sockets each send a POST's headers with ``Content-Length: 1000`` and one byte
of body (``--stall body``), or half a request line (``--stall headers``), and then nothing.
Meanwhile one client asks ``GET /healthz`` every half second for ``--seconds`` (each with a
10 s timeout). Printed per round: how many /healthz were answered and their slowest latency,
when the server closed the stalled sockets (or that it had not), and whether the worker
processes are the ones of before the round (gunicorn kills a worker that stops reporting).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEALTHZ_TIMEOUT_S = 10.0
CSRF_COOKIE = "a" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children_of(pid: int) -> list[int]:
    try:
        return sorted(int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    for child in children_of(pid):
        found += [child, *descendants(child)]
    return found


def gunicorn_master(root_pid: int) -> int | None:
    """The gunicorn arbiter under ``root_pid`` (make runs it as its child)."""
    for pid in [root_pid, *descendants(root_pid)]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"gunicorn") for part in cmdline[:2]) and children_of(pid):
            return pid
    return None


class Server:
    """The production server in its own process group (make and gunicorn under it)."""

    def __init__(self, command: str | None, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.addr}"
        argv = (
            shlex.split(command.replace("{addr}", self.addr))
            if command
            else ["make", "--no-print-directory", "-s", "serve", f"SERVE_ADDR={self.addr}"]
        )
        self.log = log_path.open("wb")
        self.process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, workers: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}")
            master = gunicorn_master(self.process.pid)
            if master and len(children_of(master)) >= workers and healthz(self.url) is not None:
                return
            time.sleep(0.3)
        raise RuntimeError(f"the server did not answer within {timeout:.0f} s")

    def worker_pids(self) -> list[int]:
        master = gunicorn_master(self.process.pid)
        return children_of(master) if master else []

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass
        self.log.close()


def healthz(url: str) -> float | None:
    """Seconds /healthz took to answer 200, or None (no answer within the timeout, an error)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=HEALTHZ_TIMEOUT_S) as answer:  # noqa: S310 - loopback
            return time.monotonic() - started if answer.status == 200 else None
    except (OSError, urllib.error.URLError):
        return None


@dataclass
class Stalled:
    """One connection that sends part of a request and then nothing."""

    addr: tuple[str, int]
    kind: str
    opened_at: float = 0.0
    closed_after: float | None = None  # when the server closed it (None: still open)
    answer: bytes = b""
    thread: threading.Thread | None = field(default=None, repr=False)
    sock: socket.socket | None = field(default=None, repr=False)

    def open(self) -> None:
        self.sock = socket.create_connection(self.addr, timeout=5)
        host = f"{self.addr[0]}:{self.addr[1]}"
        if self.kind == "body":
            head = (
                f"POST /accounts/login/ HTTP/1.1\r\nHost: {host}\r\n"
                # a well-formed CSRF cookie: the CSRF check reads the form body for its token
                f"Cookie: csrftoken={CSRF_COOKIE}\r\n"
                "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\nu"
            )
        else:
            head = "GET /healthz HTT"
        self.sock.sendall(head.encode())
        self.opened_at = time.monotonic()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        assert self.sock is not None
        self.sock.settimeout(None)
        try:
            while chunk := self.sock.recv(4096):
                self.answer += chunk
        except OSError:
            pass
        self.closed_after = time.monotonic() - self.opened_at

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()


@dataclass
class Round:
    stalled: int
    probes: int
    answered: int
    slowest_s: float
    closed: int
    closed_after_s: list[float]
    statuses: list[str]
    workers_kept: bool


def one_round(server: Server, count: int, kind: str, seconds: float) -> Round:
    before = server.worker_pids()
    port = server.port
    stalled = [Stalled(("127.0.0.1", port), kind) for _ in range(count)]
    for connection in stalled:
        connection.open()
    latencies: list[float | None] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        latencies.append(healthz(server.url))
        time.sleep(max(0.0, 0.5 - (time.monotonic() - started)))
    after = server.worker_pids()
    closed = [c for c in stalled if c.closed_after is not None]
    statuses = sorted({c.answer.split(b"\r\n", 1)[0].decode(errors="replace") or "(closed, no answer)" for c in closed})
    for connection in stalled:
        connection.close()
    answered = [latency for latency in latencies if latency is not None]
    return Round(
        stalled=count,
        probes=len(latencies),
        answered=len(answered),
        slowest_s=max(answered, default=float("nan")),
        closed=len(closed),
        closed_after_s=sorted(c.closed_after for c in closed if c.closed_after is not None),
        statuses=statuses,
        workers_kept=before == after and bool(before),
    )


def describe(result: Round, seconds: float) -> str:
    closed = (
        f"closed {result.closed}/{result.stalled} after {result.closed_after_s[0]:.1f}-{result.closed_after_s[-1]:.1f} s"
        f" ({', '.join(result.statuses)})"
        if result.closed
        else f"none of {result.stalled} closed within {seconds:.0f} s"
    )
    return (
        f"K={result.stalled:>3}: /healthz answered {result.answered}/{result.probes}"
        f" (slowest {result.slowest_s:.2f} s); stalled sockets {closed};"
        f" worker pids {'unchanged' if result.workers_kept else 'CHANGED (workers killed)'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stalled", default="4,16,64", help="K per round, comma-separated (4,16,64)")
    parser.add_argument("--stall", choices=("body", "headers"), default="body", help="what the clients leave unsent")
    parser.add_argument("--seconds", type=float, default=45.0, help="how long each round probes /healthz (45)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes the server starts (4)")
    parser.add_argument("--command", help="the server command instead of make serve; {addr} is the address")
    args = parser.parse_args()

    env = {
        **os.environ,
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", "bench-slow-clients"),
    }
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"slow_clients_{os.getpid()}.log"  # noqa: S108
    for count in (int(k) for k in args.stalled.split(",")):
        server = Server(args.command, env, log_path)
        try:
            server.wait_ready(args.workers)
            print(describe(one_round(server, count, args.stall, args.seconds), args.seconds), flush=True)
        finally:
            server.stop()
    print(f"(server log: {log_path})")


if __name__ == "__main__":
    main()
