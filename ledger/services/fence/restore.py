"""The fence across a restore (``manage.py restore_check``, after the database check).

A restored database has forgotten everything after its backup: the tokens issued since
(a per-run counter would issue them again), the credential leases revoked since (live
again), the takeovers since (leases it believes held). ``fence_restore``, in one
transaction:

* moves the fence's generation to the Unix second it runs at
  (``ledger.services.fence.generation``), so the next lease on any run gets a token
  greater than every token issued before the restore. It waits for acquisitions in
  progress (they hold the generation's row ``FOR KEY SHARE``) and holds the next ones
  until it commits, and records this database as the fence's home: until then every
  fenced call on a restored image is refused (503 RESTORE_UNCHECKED, ``lock``), so no
  worker still holding a restored lease acts between ``pg_restore`` and this;
* records ``RUN_RESTORED`` (the generation, who restored) in the chain of every run it
  touches next;
* revokes every credential lease alive in the restored database (CREDENTIAL_LEASE_REVOKED,
  reason "restore"): a dispatch under one is refused;
* ends every run lease held in the restored database as a revocation (LEASE_REVOKED,
  reason "restore", ``lease_end.leases_end``): its DISPATCHED operations become UNKNOWN
  with a reconciliation case each, and its owner's next fenced call is refused.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from ledger.actors import SYSTEM_RESTORE
from ledger.models import CredentialLease, FenceGeneration, Run, RunLease
from ledger.services.authority.credential_leases import credential_leases_end_with_run
from ledger.services.core.fencing import locked_runs
from ledger.services.evidence.append import ChainBatch
from ledger.services.fence.generation import generation_next
from ledger.services.fence.lease_end import leases_end
from ledger.sql import fence as sql_fence
from ledger.states import LeaseEnd

RESTORE_REASON = "restore"


@dataclass
class FenceRestore:
    previous_generation: int
    generation: int
    clock_ahead: bool
    runs_recorded: int = 0
    leases_ended: int = 0
    operations_unknown: int = 0
    credential_leases_revoked: int = 0

    @property
    def problem(self) -> str:
        """What a person must look at before allowing effects, or ''."""
        if self.clock_ahead:
            return ""
        return (
            "this host's clock is behind the fence (not past the stored generation or the greatest token): "
            f"the generation was raised to {self.generation} instead; check the clock, since tokens issued "
            "after the backup may not all be below the new ones"
        )


def fence_restore(*, by: str) -> FenceRestore:
    """Advance the fence past a restore and end what the restored database holds live (see
    the module). Run once per restore, on the restored database, before workers act."""
    with transaction.atomic():
        now = timezone.now()
        FenceGeneration.objects.get_or_create(pk=1)  # a database without the row is at 0
        fence = FenceGeneration.objects.select_for_update().get(pk=1)
        top = RunLease.objects.aggregate(top=Max("fencing_token"))["top"] or 0
        moved = generation_next(stored=fence.generation, clock_s=int(now.timestamp()), top_token=top)
        FenceGeneration.objects.filter(pk=1).update(
            generation=moved.generation, started_at=now, started_by=by[:150], home=sql_fence.database_identity()
        )
        result = FenceRestore(
            previous_generation=fence.generation, generation=moved.generation, clock_ahead=moved.clock_ahead
        )
        batch = ChainBatch(now)
        _end_live(result, runs=_live_runs(now=now), by=by, batch=batch)
        batch.commit()
    return result


def _live_runs(*, now: datetime) -> list[Run]:
    """The runs with a held lease or a credential lease alive at ``now``, locked in run id order."""
    held = RunLease.objects.filter(owner_id__isnull=False).values_list("run_id", flat=True)
    lent = CredentialLease.objects.filter(revoked_at__isnull=True, expires_at__gt=now).values_list("run_id", flat=True)
    run_ids = sorted({*held, *lent})
    if not run_ids:
        return []
    return locked_runs({"run_id__in": run_ids}, order_by="run_id")


def _end_live(result: FenceRestore, *, runs: list[Run], by: str, batch: ChainBatch) -> None:
    """RUN_RESTORED in each run's chain, then its credential leases revoked and its lease ended."""
    for run in runs:
        held = run.lease.owner_id is not None
        batch.append(
            run,
            "RUN_RESTORED",
            actor=SYSTEM_RESTORE,
            fields={
                "generation": result.generation,
                "previous_generation": result.previous_generation,
                "by": by,
                **({"fencing_token": run.lease.fencing_token} if held else {}),
            },
        )
        result.credential_leases_revoked += credential_leases_end_with_run(
            run=run, batch=batch, actor=SYSTEM_RESTORE, reason=RESTORE_REASON
        )
    holding = [run for run in runs if run.lease.owner_id is not None]
    if holding:
        result.operations_unknown = leases_end(
            runs=holding, batch=batch, actor=SYSTEM_RESTORE, end=LeaseEnd.REVOKED, reason=RESTORE_REASON
        )
    result.runs_recorded, result.leases_ended = len(runs), len(holding)
