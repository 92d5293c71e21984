"""A worker's calls through the services, as the demo's stories make them."""

from dataclasses import dataclass
from typing import Any

from ledger.models import Operation, Run, Tenant, Worker
from ledger.services.core.intent import Intent
from ledger.services.fence import leases, operations, outcomes, runs
from ledger.states import EffectClass, Outcome


@dataclass(frozen=True)
class Acting:
    worker: Worker

    @property
    def tenant(self) -> Tenant:
        return self.worker.tenant

    def leased(self, external_id: str, owner: str = "agent-a", ttl_s: int = 3600) -> tuple[Run, int]:
        """A new run and its lease: (run, fencing token)."""
        run, _ = runs.run_create(worker=self.worker, schema_version=1, external_id=external_id)
        token = leases.lease_acquire(worker=self.worker, run_id=run.pk, owner_id=owner, ttl_s=ttl_s).fencing_token
        return run, token

    def intend(
        self,
        run: Run,
        token: int,
        key: str,
        *,
        tool: str = "github",
        action: str = "create_issue",
        resource: str = "repo:acme/web",
        effect: EffectClass = EffectClass.IDEMPOTENT,
        provider: str = "",
    ) -> Operation:
        intent = Intent(
            tool=tool, action=action, resource=resource, effect_class=effect, idempotency_key=key, provider=provider
        )
        return operations.operation_intend(worker=self.worker, run_id=run.pk, fencing_token=token, intent=intent)[0]

    def dispatch(self, run: Run, token: int, key: str, **intent: Any) -> Operation:
        """Intend, authorize and dispatch one effect."""
        op = self.intend(run, token, key, **intent)
        operations.operation_authorize(worker=self.worker, operation_id=op.pk, fencing_token=token)
        return operations.operation_dispatch(worker=self.worker, operation_id=op.pk, fencing_token=token)

    def outcome(self, op: Operation, token: int, result: Outcome, **report: Any) -> Operation:
        return outcomes.operation_report_outcome(
            worker=self.worker, operation_id=op.pk, fencing_token=token, outcome=result, **report
        )
