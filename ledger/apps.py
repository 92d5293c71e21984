from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Fenceline ledger"

    def ready(self) -> None:
        # Register the Celery tasks in every process (web included): services queue them
        # by name (ledger.services.evidence.verification.verification_request).
        # The reconcilers' configuration is checked at start-up (manage.py check, the worker).
        from django.core import checks

        from ledger import tasks  # noqa: F401
        from ledger.services.reconciliation.checks import reconcilers_check

        checks.register(reconcilers_check, "fenceline")
