"""Cleanup drivers: how the resource reaper closes what a run held, one driver per kind (and
optionally per provider), named in ``settings.FENCELINE["RESOURCE_DRIVERS"]``:

    {"browser_session": "myco.cleanup.BrowserFleet",     # every browser session
     "connection:postgres": "myco.cleanup.PgTerminate",  # connections of one provider
     "*:sandbox": "ledger.services.lifespan.drivers.SandboxDriver"}  # the built-in default

A resource with no driver is never guessed closed: ``Unconfigured`` answers FAILED, the
reaper retries with backoff and raises an alert, and a person decides.

A driver must be idempotent — closing twice answers ALREADY_GONE the second time — because
a reaper that dies between the call and its record is followed by another that calls again.
"""

import hashlib
import os
import time
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.utils.module_loading import import_string


class Closed(StrEnum):
    CLOSED = "CLOSED"
    ALREADY_GONE = "ALREADY_GONE"
    FAILED = "FAILED"


@dataclass(frozen=True)
class Closing:
    result: Closed
    detail: str = ""  # why it failed, for the alert; never a secret


@dataclass(frozen=True)
class ResourceRef:
    """What a driver is told about the resource it closes."""

    resource_id: str
    kind: str
    provider: str
    handle: str
    attempt: int  # 1 for the first call


class CleanupDriver(Protocol):
    name: str

    def close(self, resource: ResourceRef) -> Closing: ...


class Unconfigured:
    name = "unconfigured"

    def close(self, resource: ResourceRef) -> Closing:
        return Closing(Closed.FAILED, f"no cleanup driver is configured for {resource.kind}:{resource.provider}")


class SandboxDriver:
    """A pretend provider for tests and the demo, kept in a directory so that every process
    sees the same world (``FENCELINE["SANDBOX_DIR"]``). The handle may carry instructions:
    ``?fail=N`` fails the first N calls, ``?hang=S`` sleeps S seconds before answering the
    first call (``&hang_calls=N``: the first N calls).
    Every call is appended to ``calls.log``; a closed handle leaves a marker file, so a
    second close answers ALREADY_GONE."""

    name = "sandbox"

    def __init__(self, root: Path | None = None) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        root = Path(self._root or settings.FENCELINE["SANDBOX_DIR"])
        (root / "closed").mkdir(parents=True, exist_ok=True)
        return root

    def _marker(self, provider: str, handle: str) -> Path:
        digest = hashlib.sha256(f"{provider}\0{handle}".encode()).hexdigest()
        return self.root / "closed" / digest

    def is_closed(self, provider: str, handle: str) -> bool:
        return self._marker(provider, handle).exists()

    def calls(self) -> list[str]:
        log = self.root / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def close(self, resource: ResourceRef) -> Closing:
        told = parse_qs(urlsplit(resource.handle).query)
        with open(self.root / "calls.log", "a") as log:  # one short line per call: atomic append
            log.write(f"{resource.provider} {resource.handle} {resource.attempt}\n")
        hang = float(told.get("hang", ["0"])[0])
        if hang and resource.attempt <= int(told.get("hang_calls", ["1"])[0]):
            time.sleep(hang)
        if resource.attempt <= int(told.get("fail", ["0"])[0]):
            return Closing(Closed.FAILED, f"sandbox refused the close (attempt {resource.attempt})")
        try:
            fd = os.open(self._marker(resource.provider, resource.handle), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return Closing(Closed.ALREADY_GONE)
        os.close(fd)
        return Closing(Closed.CLOSED)


@cache
def _driver(path: str) -> CleanupDriver:
    driver: CleanupDriver = import_string(path)()
    return driver


def driver_for(kind: str, provider: str) -> CleanupDriver:
    """The configured driver of ``kind:provider``, else of ``kind``, else of ``*:provider``."""
    drivers = settings.FENCELINE["RESOURCE_DRIVERS"]
    for key in (f"{kind}:{provider}", kind, f"*:{provider}"):
        if key in drivers:
            return _driver(drivers[key])
    return Unconfigured()
