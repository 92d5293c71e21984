"""The reconcilers Fenceline knows, by name, and which provider each one serves.

Configured in ``settings.FENCELINE["RECONCILERS"]`` (from ``FENCELINE_RECONCILERS``, a JSON
object, or its ``_FILE``): ``{name: {"kind": ..., "provider": "...", ...}}`` where the kind is

    "http"                          a configurable HTTP lookup (``http.py``)
    "stripe" | "github" | "slack" | "email"   a provider adapter (``providers/``)
    "python"                        a team's own: {"kind": "python", "path": "package.module:factory",
                                    ...its options}; ``factory(name, options, credential=...)``
                                    returns a Reconciler (``protocol.py``)

Each may name a credential by reference (``"auth"``, ``credentials.py``). A bad entry is an
ImproperlyConfigured naming the reconciler, raised when it is first built and by the system
check at start-up (``checks.py``). A process may also ``register`` one of its own (the
simulator and the tests register the sandbox provider they started).

An operation's reconciler is chosen when it is intended: the tool contract's ``reconciler``,
else the one registered for the operation's provider, else none — and then its UNKNOWN goes
straight to people.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ledger.services.reconciliation.credentials import credential_ref
from ledger.services.reconciliation.http import HttpReconciler
from ledger.services.reconciliation.protocol import Reconciler
from ledger.services.reconciliation.providers.email import EmailReconciler
from ledger.services.reconciliation.providers.github import GitHubReconciler
from ledger.services.reconciliation.providers.slack import SlackReconciler
from ledger.services.reconciliation.providers.stripe import StripeReconciler

KINDS: dict[str, Callable[[str, dict[str, Any]], Reconciler]] = {
    "http": HttpReconciler,
    "stripe": StripeReconciler,
    "github": GitHubReconciler,
    "slack": SlackReconciler,
    "email": EmailReconciler,
}
PYTHON = "python"
_registered: dict[str, tuple[str, Reconciler]] = {}  # name -> (provider, reconciler)
_built: dict[tuple[str, str], Reconciler] = {}  # (name, config as JSON) -> built from settings


def configured() -> dict[str, dict[str, Any]]:
    """Each configured reconciler's settings, by name (JSON values: ``http.py`` reads them)."""
    configured: dict[str, dict[str, Any]] = settings.FENCELINE.get("RECONCILERS", {})
    return configured


def register(name: str, reconciler: Reconciler, *, provider: str) -> None:
    """A reconciler of this process (it wins over a configured one of the same name)."""
    _registered[name] = (provider, reconciler)


def unregister(name: str) -> None:
    _registered.pop(name, None)


def reconciler_names() -> list[str]:
    return sorted({*configured(), *_registered})


def reconciler_named(name: str) -> Reconciler | None:
    if name in _registered:
        return _registered[name][1]
    config = configured().get(name)
    if config is None:
        return None
    key = (name, repr(sorted(config.items())))
    if key not in _built:
        _built[key] = reconciler_built(name, config)
    return _built[key]


def reconciler_built(name: str, config: dict[str, Any]) -> Reconciler:
    """The reconciler ``config`` describes (raises ImproperlyConfigured naming ``name``)."""
    options = {k: v for k, v in config.items() if k != "provider"}
    kind = options.get("kind", "")
    if kind == PYTHON:
        return _python_reconciler(name, options)
    build = KINDS.get(kind)
    if build is None:
        raise ImproperlyConfigured(f"reconciler {name!r}: kind must be one of {', '.join([*KINDS, PYTHON])}")
    return build(name, options)


def _python_reconciler(name: str, options: dict[str, Any]) -> Reconciler:
    """A team's reconciler by dotted path ``package.module:factory``."""
    path = options.pop("path", None)
    options.pop("kind")
    module_name, sep, attribute = path.partition(":") if isinstance(path, str) else ("", "", "")
    if not (module_name and sep and attribute.isidentifier()):
        raise ImproperlyConfigured(f'reconciler {name!r}: path must be "package.module:factory", got {path!r}')
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"reconciler {name!r}: path {path!r} cannot be imported ({type(exc).__name__})"
        ) from None
    except AttributeError:
        raise ImproperlyConfigured(f"reconciler {name!r}: module {module_name!r} has no {attribute!r}") from None
    if not callable(factory):
        raise ImproperlyConfigured(f"reconciler {name!r}: {path!r} is not callable")
    credential = credential_ref(name, options.pop("auth", None))
    reconciler: Reconciler = factory(name, options, credential=credential)
    if not callable(getattr(reconciler, "lookup", None)):
        raise ImproperlyConfigured(f"reconciler {name!r}: {path!r} returned no reconciler (it has no lookup)")
    return reconciler


def reconciler_for_provider(provider: str) -> str:
    """The name of the reconciler that serves ``provider``, or "" when none does."""
    if not provider:
        return ""
    for name, (served, _reconciler) in sorted(_registered.items()):
        if served == provider:
            return name
    for name, config in sorted(configured().items()):
        if config.get("provider") == provider:
            return name
    return ""
