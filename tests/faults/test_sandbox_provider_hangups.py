"""The sandbox provider with callers that hang up (a client's timeout on a slow answer, a
dropped answer): nothing is printed, no traceback in the simulator's or the demo's terminal."""

import socket
import struct
import time

from console.simulation.provider import SandboxProvider


def _charge_and_hang_up(provider: SandboxProvider, fault: str, key: str) -> None:
    host, port = provider.url.removeprefix("http://").split(":")
    body = b'{"amount_cents": 1200, "customer": "c:1"}'
    head = (
        f"POST /v1/charges HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: {key}\r\nSandbox-Fault: {fault}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port))) as caller:
        caller.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, at once
        caller.sendall(head + body)


def test_callers_that_hang_up_print_nothing(capfd):
    provider = SandboxProvider().start()
    provider.slow_s = 0.3
    try:
        for i, fault in enumerate(("slow", "drop", "slow", "drop")):
            _charge_and_hang_up(provider, fault, f"hang-up-{i}")
        deadline = time.monotonic() + 30
        while provider.ledger.stats().get("charges", 0) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(provider.slow_s * 4)  # the slow answers have been written to the closed sockets
    finally:
        provider.stop()
    printed = capfd.readouterr()
    assert printed.err == "" and printed.out == "", printed
