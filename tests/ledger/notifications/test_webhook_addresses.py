"""A webhook never reaches this machine or the private network unless the operator names the
host (ledger/services/notifications/addresses.py): a target is refused when it is configured
(the field ``target`` named, in the service and on the console page) and again at every
send, where the refusal records ``refused_address`` and nothing about what answers there; the
send connects only to an address it checked; a redirect is a failed delivery, never followed.

The internal services here are real listeners on 127.0.0.1 (tests.helpers.Sink); the test
settings allow 127.0.0.1 for the other webhook tests, and each test here narrows that."""

import socket
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals.services.notifications import notifications_scan
from ledger.errors import InvalidInput
from ledger.models import WebhookDelivery, WebhookEndpoint
from ledger.models.notifications import DeliveryStatus
from ledger.services.notifications.addresses import ConnectRefused, session_for
from ledger.services.notifications.delivery import deliveries_send
from tests.factories import webhook_endpoint, worker_in
from tests.helpers import Browser, Sink

INTERNAL = [
    "http://127.0.0.1:6379/",
    "https://127.0.0.1:6379/",
    "https://127.0.0.2/",
    "http://[::1]/",
    "https://[::1]:8080/",
    "https://169.254.169.254/latest/meta-data/",
    "https://10.0.0.1/",
    "https://172.16.0.1/",
    "https://192.168.1.1/",
    "https://100.64.0.1/",
    "https://0.0.0.0/",
    "https://0/",
    "https://224.0.0.1/",
    "https://239.255.255.250:1900/",
    "https://240.0.0.1/",
    "https://255.255.255.255/",
    "https://localhost/",
    "https://LOCALHOST:6379/",
    "https://2130706433/",  # 127.0.0.1 in decimal
    "https://0x7f.1/",  # in hex
    "https://0x7f000001/",
    "https://017700000001/",  # in octal
    "https://0177.0.0.1/",
    "https://127.1/",
    "https://[::ffff:127.0.0.1]/",  # IPv4-mapped IPv6
    "https://[::ffff:7f00:1]/",
    "https://[::ffff:a9fe:a9fe]/",  # 169.254.169.254, mapped
    "https://[64:ff9b::7f00:1]/",  # NAT64 of 127.0.0.1
    "https://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
    "https://[fe80::1]/",
    "https://[fc00::1]/",
    "https://[fec0::1]/",
    "https://[ff02::1]/",
    "https://[::]/",
]


@pytest.fixture
def nothing_allowed(settings):
    settings.FENCELINE = {**settings.FENCELINE, "WEBHOOK_ALLOWED_HOSTS": frozenset()}


def allow(settings, *hosts: str) -> None:
    settings.FENCELINE = {**settings.FENCELINE, "WEBHOOK_ALLOWED_HOSTS": frozenset(hosts)}


@pytest.fixture
def internal():
    """A service on this machine a webhook must not reach (it answers 200 to anything)."""
    made = Sink((200,))
    yield made
    made.close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def refused_at_configuration(tenant, target: str) -> InvalidInput:
    with pytest.raises(InvalidInput) as refused:
        webhook_endpoint(tenant, target)
    return refused.value


# --- at configuration ----------------------------------------------------------------------


@pytest.mark.parametrize("target", INTERNAL)
def test_an_internal_target_is_refused_when_configured_naming_the_field(acme, nothing_allowed, target):
    refused = refused_at_configuration(acme.tenant, target)
    assert refused.extra["fields"][0]["field"] == "target"
    assert WebhookEndpoint.objects.count() == 0


def test_changing_a_target_to_an_internal_one_is_refused(acme, nothing_allowed):
    from ledger.services.notifications.endpoints import endpoint_update

    made = webhook_endpoint(acme.tenant, "https://hooks.example.com/in").endpoint
    with pytest.raises(InvalidInput) as refused:
        endpoint_update(tenant=acme.tenant, endpoint_id=made.pk, target="http://[::1]/", reason="x", changed_by="a")
    assert refused.value.extra["fields"][0]["field"] == "target"
    made.refresh_from_db()
    assert made.target == "https://hooks.example.com/in"


@pytest.mark.parametrize("target", ["http://127.0.0.1:6379/", "https://169.254.169.254/", "https://2130706433/"])
def test_the_console_form_refuses_an_internal_target_naming_the_field(acme, admin, nothing_allowed, target):
    form = {"name": "ops", "target": target, "kinds": ["quarantine"], "unknown_after_min": "20", "reason": "x"}
    answer = Browser(admin).post(reverse("tenant-webhook-create", args=["acme"]), form)
    assert answer.status_code == 422
    assert answer.context["error_field"] == "target"
    assert "FENCELINE_WEBHOOK_ALLOWED_HOSTS" in answer.content.decode()
    assert WebhookEndpoint.objects.count() == 0


def test_only_the_named_host_and_port_are_allowed_not_other_spellings_or_ports(acme, settings, internal):
    port = internal.server.server_address[1]
    allow(settings, f"127.0.0.1:{port}")
    assert webhook_endpoint(acme.tenant, internal.url(), name="sink").endpoint.target == internal.url()
    for other in (
        "http://127.0.0.1:6379/",
        f"http://localhost:{port}/",
        f"https://localhost:{port}/",
        f"https://2130706433:{port}/",
        f"https://[::ffff:127.0.0.1]:{port}/",
    ):
        assert refused_at_configuration(acme.tenant, other).extra["fields"][0]["field"] == "target"


def test_a_public_https_target_and_an_unresolvable_name_are_accepted(acme, nothing_allowed):
    assert webhook_endpoint(acme.tenant, "https://93.184.215.14/in", name="a").endpoint.pk
    assert webhook_endpoint(acme.tenant, "https://[2606:4700::1111]/in", name="b").endpoint.pk
    # Not resolvable now (no network here): checked again, and connected to, when sent.
    assert webhook_endpoint(acme.tenant, "https://hooks.example.invalid/in", name="c").endpoint.pk


# --- at every send -------------------------------------------------------------------------


def due_deliveries(tenant, **targets: str) -> dict[str, WebhookDelivery]:
    """One due delivery (a quarantine) to each endpoint ``name=target``."""
    for name, target in targets.items():
        webhook_endpoint(tenant, target, name=name)
    worker_in(tenant, "QUARANTINED", "w-quarantined")
    notifications_scan()
    return {name: WebhookDelivery.objects.get(endpoint__name=name) for name in targets}


def due_delivery(tenant, target: str) -> WebhookDelivery:
    return due_deliveries(tenant, ops=target)["ops"]


def record(delivery: WebhookDelivery) -> tuple:
    delivery.refresh_from_db()
    return delivery.status, delivery.attempts, delivery.last_status_code, delivery.last_error


def test_an_allowance_withdrawn_after_configuration_is_refused_at_send_and_nothing_reaches_it(acme, settings, internal):
    delivery = due_delivery(acme.tenant, internal.url())  # allowed when configured (127.0.0.1)
    allow(settings)
    assert deliveries_send().gave_up == 1
    assert record(delivery) == (DeliveryStatus.GAVE_UP, 1, None, "refused_address")
    assert internal.requests == []


@pytest.mark.parametrize("spelling", ["localhost", "2130706433", "0x7f.1", "127.1", "[::ffff:127.0.0.1]"])
def test_a_stored_target_naming_this_machine_otherwise_is_refused_at_send(acme, settings, internal, spelling):
    """A row changed behind the service's back (or configured when the name resolved
    elsewhere): the send resolves it again and refuses, though 127.0.0.1 itself is allowed."""
    delivery = due_delivery(acme.tenant, "https://hooks.example.com/in")
    port = internal.server.server_address[1]
    WebhookEndpoint.objects.update(target=f"https://{spelling}:{port}/hook")
    assert deliveries_send().gave_up == 1
    assert record(delivery) == (DeliveryStatus.GAVE_UP, 1, None, "refused_address")
    assert internal.requests == []


def test_the_delivery_log_is_the_same_whether_an_internal_port_answers_or_not(acme, settings, internal):
    due = due_deliveries(acme.tenant, listening=internal.url(), closed=f"http://127.0.0.1:{closed_port()}/hook")
    allow(settings)
    deliveries_send()
    assert record(due["listening"]) == record(due["closed"]) == (DeliveryStatus.GAVE_UP, 1, None, "refused_address")
    assert internal.requests == []


def test_the_send_connects_only_to_an_address_it_checked(internal):
    """The connect-time check (requests-hardened's adapter), below the pre-send one: a name
    that resolves to this machine is refused when the connection is made, with nothing sent."""
    port = internal.server.server_address[1]
    with session_for("localhost", port) as session, pytest.raises(ConnectRefused):
        session.post(f"http://localhost:{port}/hook", data=b"{}", timeout=5, allow_redirects=False)
    assert internal.requests == []


# --- redirects -----------------------------------------------------------------------------


class Redirector:
    """An allowed receiver that answers every POST with a redirect to ``location``."""

    def __init__(self, location: str, status: int = 307):
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.hits += 1
                self.send_response(status)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_from_an_allowed_receiver_to_an_internal_one_is_a_failed_delivery(acme, settings, internal, status):
    redirector = Redirector(internal.url("/stolen"), status)
    try:
        # Even with both allowed, a redirect is never followed.
        allow(
            settings,
            f"127.0.0.1:{redirector.server.server_address[1]}",
            f"127.0.0.1:{internal.server.server_address[1]}",
        )
        delivery = due_delivery(acme.tenant, redirector.url())
        deliveries_send()
        assert record(delivery) == (DeliveryStatus.GAVE_UP, 1, status, f"http_{status}")
        assert redirector.hits == 1 and internal.requests == []
        deliveries_send(now=timezone.now() + timedelta(hours=2))  # given up: never again
        assert redirector.hits == 1
    finally:
        redirector.close()


def test_an_ipv6_host_is_named_in_brackets_with_its_port(acme, settings):
    allow(settings, "[::1]:8080")
    assert webhook_endpoint(acme.tenant, "http://[::1]:8080/hook", name="v6").endpoint.pk
    assert refused_at_configuration(acme.tenant, "http://[::1]:8081/hook").extra["fields"][0]["field"] == "target"
    allow(settings, "::1:8080")  # an IPv6 address, not ::1 with a port
    assert refused_at_configuration(acme.tenant, "http://[::1]:8080/hook").extra["fields"][0]["field"] == "target"


def test_a_name_that_does_not_resolve_at_send_is_retried_as_a_connection_failure(acme, nothing_allowed):
    """Through requests-hardened's session (the host is not allowed by name): no address, no
    connection — retried like any unreachable receiver, not given up as refused."""
    delivery = due_delivery(acme.tenant, "https://hooks.example.invalid/in")
    deliveries_send()
    assert record(delivery) == (DeliveryStatus.PENDING, 1, None, "connection")
