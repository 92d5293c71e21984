"""The schema change under test in the schema-migration failure injections (issue 18):
operation.provider_ref (ledger/services/upgrades/provider_ref.py). Records written "by the
old build" are written the way that build wrote them: the string id only, schema_version 1,
no provider_ref (its UPDATE never knew the new column)."""

from ledger.models import Operation, Worker
from ledger.services.upgrades import provider_ref
from ledger.services.upgrades.changes import change_move
from tests.factories import booted, intended_operation, leased_run

CHANGE = provider_ref.CHANGE


def move(to: str, *, fleet_upgraded: bool = True) -> None:
    """Move the change; first, unless told otherwise, every worker reports a build that reads
    version 2 (a live worker without a boot report cannot be shown to read it: MIGRATE waits)."""
    if fleet_upgraded:
        for worker in Worker.objects.all():
            if not worker.boots.filter(state_schema_version__gte=2).exists():
                booted(worker, reads=2)
    change_move(name=CHANGE, to=to, by="test", reason=f"test moves to {to}")


def old_build_writes(op: Operation, provider_request_id: str) -> None:
    """What the build before the change stored: the string only, at version 1."""
    Operation.objects.filter(pk=op.pk).update(provider_request_id=provider_request_id, schema_version=1)


def version_one_operations(acme, count: int) -> list[Operation]:
    """``count`` operations as the old build left them: a third with a provider id."""
    run, token = leased_run(acme.worker, ttl_s=600)
    ops = [intended_operation(acme.worker, run, token, f"v1-{i}", "IDEMPOTENT") for i in range(count)]
    for i, op in enumerate(ops):
        Operation.objects.filter(pk=op.pk).update(
            schema_version=1, provider_ref=None, provider_request_id=f"prov-{i}" if i % 3 == 0 else ""
        )
    return ops


def all_agree() -> bool:
    return all(
        provider_ref.agrees(schema_version=v, provider=p, provider_request_id=r, provider_ref=ref)
        for v, p, r, ref in Operation.objects.values_list(
            "schema_version", "provider", "provider_request_id", "provider_ref"
        )
    )
