"""The worker client's transport (fenceline_client.client on urllib3): no answer is a TransportError,
never a refusal; a request is sent once and never repeated behind the caller's back; the
connection is kept alive between calls; a proxy the environment names is used, NO_PROXY is
honoured; a renewal that gets no answer is a passing outage, not a lost lease."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from fenceline_client import client as fl


class Recorder:
    """A one-thread HTTP/1.1 server on a free port that records each request line and
    answers it with ``answer(request_line)``: (status, body, headers), or None to close the
    connection without a word."""

    def __init__(self, answer: Callable[[str], tuple[int, dict | bytes | str, dict] | None]) -> None:
        self.answer = answer
        self.lines: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.talk, args=(conn,), daemon=True).start()

    def talk(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while self.one(conn, reader):
                pass

    def one(self, conn: socket.socket, reader) -> bool:
        line = reader.readline().decode().strip()
        if not line:
            return False
        headers: dict[str, str] = {}
        while (header := reader.readline().decode().strip()) != "":
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
        reader.read(int(headers.get("content-length", "0")))
        self.lines.append(line)
        self.headers.append(headers)
        answered = self.answer(line)
        if answered is None:
            return False
        status, body, extra = answered
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in extra.items())
        conn.sendall(head.encode() + b"\r\n" + payload)
        return True

    def close(self) -> None:
        self.listener.close()


@contextmanager
def recorder(answer: Callable[[str], tuple[int, dict | bytes | str, dict] | None]) -> Iterator[Recorder]:
    server = Recorder(answer)
    try:
        yield server
    finally:
        server.close()


def ok(_line: str) -> tuple[int, dict, dict]:
    return 200, {"ok": True}, {}


def test_answers_on_one_kept_alive_connection_with_the_token_and_the_body():
    with recorder(ok) as server:
        client = fl.Client(server.url, "tok-123")
        assert client.post("/workers/me/heartbeat", {"x": 1}) == {"ok": True}
        assert client.get("/runs/abc") == {"ok": True}
    assert server.lines == ["POST /api/v1/workers/me/heartbeat HTTP/1.1", "GET /api/v1/runs/abc HTTP/1.1"]
    assert server.connections == 1
    assert server.headers[0]["authorization"] == "Bearer tok-123"
    assert server.headers[0]["content-type"] == "application/json"


def test_threads_calling_at_once_each_get_a_connection_and_keep_it(caplog):
    with recorder(ok) as server:
        client = fl.Client(server.url, "t")
        start = threading.Barrier(4)

        def calls() -> None:
            start.wait()
            for _ in range(5):
                assert client.heartbeat() == {"ok": True}

        threads = [threading.Thread(target=calls) for _ in range(4)]
        with caplog.at_level(logging.WARNING, logger="urllib3"):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    assert len(server.lines) == 20
    assert server.connections <= 4  # kept between calls, not one per call
    assert not [record for record in caplog.records if "pool is full" in record.getMessage()]


def test_a_path_prefix_in_the_base_url_is_kept():
    with recorder(ok) as server:
        fl.Client(server.url + "/fenceline/", "t").heartbeat()
    assert server.lines == ["POST /fenceline/api/v1/workers/me/heartbeat HTTP/1.1"]


def test_no_server_is_a_transport_error_not_a_refusal():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    client = fl.Client(f"http://127.0.0.1:{port}", "t", timeout=2)
    with pytest.raises(fl.TransportError) as raised:
        client.heartbeat()
    assert not isinstance(raised.value, fl.FencelineError)
    assert isinstance(raised.value, OSError)


def test_a_dropped_answer_is_a_transport_error_and_the_request_is_sent_once():
    with recorder(lambda _line: None) as server:
        client = fl.Client(server.url, "t", timeout=2)
        with pytest.raises(fl.TransportError):
            client.post("/operations/op-1/outcome", {"outcome": "CONFIRMED"})
        time.sleep(0.2)
    assert server.lines == ["POST /api/v1/operations/op-1/outcome HTTP/1.1"]  # not repeated


def test_an_answer_that_does_not_come_in_time_is_a_transport_error():
    def slow(_line: str) -> tuple[int, dict, dict]:
        time.sleep(1.5)
        return 200, {}, {}

    with recorder(slow) as server:
        client = fl.Client(server.url, "t", timeout=0.5)
        with pytest.raises(fl.TransportError):
            client.heartbeat()


def test_a_redirect_is_not_followed():
    def moved(_line: str) -> tuple[int, dict, dict]:
        return 307, {}, {"Location": "http://127.0.0.1:1/elsewhere"}

    with recorder(moved) as server:
        status, _ = fl.Client(server.url, "t").call("POST", "/runs", {})
    assert status == 307 and len(server.lines) == 1


def test_a_refusal_and_a_body_that_is_not_json_reach_their_exceptions():
    def refuse(line: str) -> tuple[int, dict | bytes | str, dict]:
        if "stale" in line:
            return 409, {"error": "STALE_TOKEN", "detail": "x"}, {}
        if "page" in line:
            return 502, b"<html>bad gateway</html>", {}
        return 503, "a JSON string, not the API's object", {}

    with recorder(refuse) as server:
        client = fl.Client(server.url, "t")
        with pytest.raises(fl.StaleToken):
            client.post("/stale")
        with pytest.raises(fl.ServerError) as page:
            client.post("/page")
        with pytest.raises(fl.ServerError) as string:
            client.post("/string")
    assert page.value.status == 502 and "bad gateway" in page.value.body["detail"]
    assert string.value.status == 503


def test_the_stop_directive_on_any_answer_is_remembered():
    with recorder(lambda _line: (200, {}, {fl.DIRECTIVE_HEADER: "STOP_WORKER"})) as server:
        client = fl.Client(server.url, "t")
        client.heartbeat()
    assert client.stop_requested


def test_the_proxy_the_environment_names_is_used_and_no_proxy_is_honoured(monkeypatch):
    with recorder(ok) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "")
        fl.Client("http://fenceline.invalid:8000", "t").heartbeat()
        assert proxy.lines == ["POST http://fenceline.invalid:8000/api/v1/workers/me/heartbeat HTTP/1.1"]
        with recorder(ok) as direct:
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            fl.Client(direct.url, "t").heartbeat()
        assert direct.lines == ["POST /api/v1/workers/me/heartbeat HTTP/1.1"] and len(proxy.lines) == 1


def test_a_renewal_without_an_answer_is_a_passing_outage_not_a_lost_lease():
    answered = {"renewals": 0}

    def flaky(line: str) -> tuple[int, dict, dict] | None:
        if line.startswith("POST /api/v1/workers/me/boots "):  # the boot report before the first lease
            return 201, {"delay_s": 0, "quarantined": False}, {}
        if line.startswith("POST /api/v1/runs/r1/lease "):
            return 201, {"fencing_token": 7}, {}
        if "/lease/renew" in line:
            answered["renewals"] += 1
            return None if answered["renewals"] == 1 else (200, {}, {})  # the first renewal: no answer
        return 200, {}, {}

    with recorder(flaky) as server:
        client = fl.Client(server.url, "t-renewal", timeout=2)
        with client.lease("r1", ttl_s=1) as lease:
            deadline = time.monotonic() + 10
            while lease.renewals < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert lease.alive and lease.renewals >= 1 and lease.token == 7
    assert answered["renewals"] >= 2
    assert server.lines[:2] == ["POST /api/v1/workers/me/boots HTTP/1.1", "POST /api/v1/runs/r1/lease HTTP/1.1"]
