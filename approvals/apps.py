from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Fenceline approvals"

    def ready(self) -> None:
        # The fence and the authority checks hand work to people through this interface
        # (ledger.services.core.handoff); the approvals app implements it.
        from approvals.services import handoff
        from ledger.services.core.handoff import register

        register(handoff)
        # /metrics reads the cases and approval requests beside the ledger's families.
        from approvals.metrics import ApprovalsMetrics
        from ledger.observability import metrics

        metrics.register("approvals", ApprovalsMetrics())
        from approvals import tasks  # noqa: F401 - registers its Celery tasks in every process
