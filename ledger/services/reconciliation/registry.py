"""The reconcilers Fenceline knows, by name, and which provider each one serves.

Configured in ``settings.FENCELINE["RECONCILERS"]`` (from ``FENCELINE_RECONCILERS``, a JSON
object, or its ``_FILE``): ``{name: {"kind": "http", "provider": "...", ...}}`` — the HTTP
reconciler's settings are in ``http.py``. A process may also ``register`` one of its own
(the simulator and the tests register the sandbox provider they started).

An operation's reconciler is chosen when it is intended: the tool contract's ``reconciler``,
else the one registered for the operation's provider, else none — and then its UNKNOWN goes
straight to people.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ledger.services.reconciliation.http import HttpReconciler
from ledger.services.reconciliation.protocol import Reconciler

KINDS = {"http": HttpReconciler}
_registered: dict[str, tuple[str, Reconciler]] = {}  # name -> (provider, reconciler)
_built: dict[tuple[str, str], Reconciler] = {}  # (name, config as JSON) -> built from settings


def _configured() -> dict[str, dict[str, Any]]:
    """Each configured reconciler's settings, by name (JSON values: ``http.py`` reads them)."""
    configured: dict[str, dict[str, Any]] = settings.FENCELINE.get("RECONCILERS", {})
    return configured


def register(name: str, reconciler: Reconciler, *, provider: str) -> None:
    """A reconciler of this process (it wins over a configured one of the same name)."""
    _registered[name] = (provider, reconciler)


def unregister(name: str) -> None:
    _registered.pop(name, None)


def reconciler_names() -> list[str]:
    return sorted({*_configured(), *_registered})


def reconciler_named(name: str) -> Reconciler | None:
    if name in _registered:
        return _registered[name][1]
    config = _configured().get(name)
    if config is None:
        return None
    key = (name, repr(sorted(config.items())))
    if key not in _built:
        kind = KINDS.get(config.get("kind", ""))
        if kind is None:
            raise ImproperlyConfigured(f"reconciler {name!r}: kind must be one of {', '.join(KINDS)}")
        _built[key] = kind(name, {k: v for k, v in config.items() if k != "provider"})
    return _built[key]


def reconciler_for_provider(provider: str) -> str:
    """The name of the reconciler that serves ``provider``, or "" when none does."""
    if not provider:
        return ""
    for name, (served, _reconciler) in sorted(_registered.items()):
        if served == provider:
            return name
    for name, config in sorted(_configured().items()):
        if config.get("provider") == provider:
            return name
    return ""
