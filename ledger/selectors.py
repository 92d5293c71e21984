"""Reads, scoped to a tenant (worker API) or a user (console)."""

from ledger.models import Run, Tenant, Worker
from ledger.services.errors import NotFound
from ledger.services.fencing import parse_id
from ledger.services.workers import token_digest


def worker_for_token(token: str) -> Worker | None:
    return Worker.objects.select_related("tenant").filter(token_hash=token_digest(token)).first()


def run_get(*, tenant: Tenant, run_id: object) -> Run:
    run = Run.objects.select_related("lease").filter(tenant=tenant, pk=parse_id(run_id, "run")).first()
    if run is None:
        raise NotFound("run not found")
    return run


def run_indicators(run: Run) -> dict[str, dict]:
    """The four indicators, each with its value, its evidence and a reason when not green.
    Read from counters the transitions keep and from the verifier's last result: O(1)."""
    in_flight = run.n_dispatched
    intended = run.n_planned + run.n_pending_approval + run.n_authorized
    open_at_completion = run.n_dispatched + run.n_unknown

    if run.broken_reason == "gap":
        completeness = {
            "value": "INCOMPLETE",
            "reason": f"events {run.broken_first_seq}..{run.broken_last_seq} are missing",
        }
    elif run.status == "COMPLETED" and open_at_completion:
        completeness = {
            "value": "INCOMPLETE",
            "reason": f"{open_at_completion} dispatched effect(s) had no terminal outcome at completion",
        }
    else:
        completeness = {"value": "COMPLETE", "reason": None}

    if run.broken_reason:
        integrity = {
            "value": "BROKEN",
            "first_bad_seq": run.broken_first_seq,
            "last_bad_seq": run.broken_last_seq,
            "reason": f"{run.broken_reason} at seq {run.broken_first_seq}..{run.broken_last_seq}: {run.broken_detail}",
        }
    elif run.verified_checkpoint_seq is not None and run.verified_checkpoint_seq == run.last_seq:
        integrity = {"value": "VERIFIED", "checkpoint_seq": run.verified_checkpoint_seq, "reason": None}
    else:
        sealed = run.verified_checkpoint_seq
        integrity = {
            "value": "UNSEALED",
            "checkpoint_seq": sealed,
            "reason": (
                f"head seq {run.last_seq} is beyond the last checkpoint ({sealed})"
                if sealed
                else f"no checkpoint yet for head seq {run.last_seq}"
            ),
        }

    if run.authorization_mismatches:
        authorization = {"value": "MISMATCH", "mismatches": run.authorization_mismatches, "reason": run.authorization_detail}
    else:
        authorization = {"value": "OK", "mismatches": 0, "reason": None}

    counts = {
        "confirmed": run.n_confirmed,
        "unknown": run.n_unknown,
        "reconciled": run.n_reconciled,
        "failed": run.n_failed,
        "in_flight": in_flight,
        "intended_only": intended,
    }
    if run.n_unknown or in_flight:
        certainty = {
            "value": "UNCERTAIN",
            "counts": counts,
            "reason": f"{run.n_unknown} UNKNOWN, {in_flight} dispatched without an outcome yet",
        }
    else:
        certainty = {"value": "CERTAIN", "counts": counts, "reason": None}
    return {"completeness": completeness, "integrity": integrity, "authorization": authorization, "certainty": certainty}


def approval_get(*, tenant: Tenant, approval_id: object):
    from approvals.models import ApprovalRequest

    approval = ApprovalRequest.objects.filter(tenant=tenant, pk=parse_id(approval_id, "approval")).first()
    if approval is None:
        raise NotFound("approval not found")
    return approval

