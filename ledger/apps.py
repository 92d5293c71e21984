from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Fenceline ledger"

    def ready(self) -> None:
        # Register the Celery tasks in every process (web included): services queue them
        # by name (ledger.services.evidence.verification.verification_request).
        from ledger import tasks  # noqa: F401
