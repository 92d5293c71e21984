"""Where a webhook may connect: a public address, never this machine or the private network a
tenant cannot reach itself (server-side request forgery), unless the operator names the host.

* An address is public when Python's ``ipaddress`` calls it global and it is none of
  multicast, reserved, site-local; an IPv6 address that carries an IPv4 one (mapped, 6to4,
  Teredo) is judged by that one too. Loopback, link-local (169.254.169.254, the cloud metadata
  service), private, shared (100.64/10), unspecified and documentation ranges are not public.
* ``FENCELINE_WEBHOOK_ALLOWED_HOSTS`` names the exceptions, as written in a target's URL:
  ``host`` (any port) or ``host:port`` (``[v6]:port``). Nothing else is matched: not another
  spelling of the address, not another name that resolves to it.
* A target is checked when it is configured (its host as a literal in any spelling the
  resolver accepts, ``2130706433`` and ``0x7f.1`` included, or every address its name resolves
  to now) and again before each send; the send itself goes through requests-hardened's
  adapter, which resolves once, refuses a non-public address and connects to the address it
  checked (the name kept for ``Host`` and TLS SNI), so a name that resolves elsewhere on the
  second lookup (DNS rebinding) is refused too. Redirects are never followed.
"""

import ipaddress
import socket

import requests
from django.conf import settings
from requests_hardened import Config, Manager
from requests_hardened.ip_filter import InvalidIPAddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

REFUSED = "refused_address"  # what a delivery records: never the address or the port

_HARDENED = Manager(
    Config(ip_filter_enable=True, ip_filter_allow_loopback_ips=False, never_redirect=True, default_timeout=(5, 5))
)


class AddressRefused(Exception):
    """The target's host is, or resolves to, an address that is not public."""


# requests-hardened's refusal at connect time (a subclass of requests.RequestException).
ConnectRefused = InvalidIPAddress


def address_public(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        teredo = ip.teredo
        for carried in (ip.ipv4_mapped, ip.sixtofour, teredo[1] if teredo else None):
            if carried is not None and not address_public(carried):
                return False
        if ip.is_site_local:
            return False
    return ip.is_global and not (ip.is_multicast or ip.is_reserved)


def host_allowed(host: str, port: int) -> bool:
    """The operator named ``host`` (any port) or ``host:port`` in WEBHOOK_ALLOWED_HOSTS."""
    allowed = settings.FENCELINE["WEBHOOK_ALLOWED_HOSTS"]
    host = host.lower()
    named = {host, f"[{host}]", f"[{host}]:{port}"} if ":" in host else {host, f"{host}:{port}"}
    return not allowed.isdisjoint(named)


def host_addresses(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` names: itself when it is a literal (in any spelling the system's
    resolver accepts), else what it resolves to now. Raises ``socket.gaierror``."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in found]


def host_check(scheme: str, host: str, port: int) -> None:
    """AddressRefused unless ``host`` is allowed by name, or is reached over https and names
    only public addresses. A name that does not resolve now passes: the send resolves it
    again, and fails to connect."""
    if host_allowed(host, port):
        return
    if scheme != "https":
        raise AddressRefused
    try:
        addresses = host_addresses(host, port)
    except (socket.gaierror, UnicodeError, ValueError):
        return
    if not addresses or not all(address_public(ip) for ip in addresses):
        raise AddressRefused


def session_for(host: str, port: int) -> requests.Session:
    """The session a delivery to ``host`` is sent with: requests-hardened's (public addresses
    only, checked at connect time) unless the operator allowed the host; never a proxy or
    credentials from the environment (``trust_env`` off), never a redirect."""
    session = requests.Session() if host_allowed(host, port) else _HARDENED.get_session()
    session.trust_env = False
    return session
