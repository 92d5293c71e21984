"""The reconcilers' configuration checked at start-up: a Django system check, so ``manage.py
check``, ``migrate``, ``runserver`` and the Celery worker (which runs the checks when it starts)
refuse a reconciler that cannot be built — an unknown kind, a bad setting, a python path that
does not import — or whose credential reference cannot be resolved. Each error names the
reconciler and the reference (``env:STRIPE_KEY``), never a value."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ledger.services.reconciliation.credentials import credential_ref
from ledger.services.reconciliation.registry import configured, reconciler_built


def reconcilers_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for name, config in sorted(configured().items()):
        try:
            reconciler_built(name, dict(config))
            credential = credential_ref(name, config.get("auth"))
        except ImproperlyConfigured as exc:
            errors.append(checks.Error(str(exc), obj="FENCELINE_RECONCILERS", id="fenceline.E101"))
            continue
        problem = credential.problem() if credential is not None else ""
        if problem:
            errors.append(checks.Error(problem, obj="FENCELINE_RECONCILERS", id="fenceline.E102"))
    return errors
