"""Issue 36, item 1: the fence is monotonic across a restore. A real backup (manage.py backup,
pg_dump), more takeovers and a credential lease revoked, a real pg_restore of that backup
over the same database (every fenced call refused 503 RESTORE_UNCHECKED until the check), then
manage.py restore_check: the next lease on the run gets a token
greater than every token issued before the restore (those after the backup too), the
revoked credential lease is refused, the lease held in the backup is ended with its
dispatched operation UNKNOWN and a case, and the run's chain records the restore and
verifies."""

import subprocess
import threading
import time

import pytest
from django.db import connection, connections, transaction

from approvals.models import ReconciliationCase
from ledger.errors import Denied, DomainError, RestoreUnchecked
from ledger.models import CredentialLease, Event, FenceGeneration, LeaseGrant, Operation, Run
from ledger.services.authority.credential_leases import credential_lease_revoke
from ledger.services.authority.credentials import credential_create
from ledger.services.authority.policy import policy_change
from ledger.services.core.intent import Intent
from ledger.services.evidence.verification import ledger_verify
from ledger.services.fence import leases, operations
from ledger.services.fence.generation import token_floor
from ledger.services.fence.restore import fence_restore
from ledger.services.upgrades.restore import effects_allow
from ledger.sql import fence as sql_fence
from tests.factories import credential_lease, expire, new_run
from tests.faults.test_fence_reads_under_the_lock import wait_until_blocked_on_a_lock
from tests.faults.test_migration_restore import _manage

pytestmark = pytest.mark.django_db(transaction=True)

PRINCIPAL = "github-bot"
RESOURCE = "repo:acme/api"


def _authorized(acme, run, token, key, lease_id):
    op, _ = operations.operation_intend(
        worker=acme.worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool="github", action="create_issue", resource=RESOURCE, effect_class="IDEMPOTENT", idempotency_key=key
        ),
    )
    return operations.operation_authorize(
        worker=acme.worker, operation_id=op.pk, fencing_token=token, credential_lease_id=lease_id
    )


def _takeover(acme, run, owner):
    expire(run)
    return leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id=owner, ttl_s=600).fencing_token


def _restore_in_place(database, dump):
    """pg_restore the dump over ``database`` (every connection to it closed first)."""
    connections.close_all()
    options = ["--no-owner", "--clean", "--if-exists", "--single-transaction"]
    loaded = subprocess.run(
        ["pg_restore", "-h", "127.0.0.1", "-U", "postgres", *options, "-d", database, str(dump)],
        capture_output=True,
        text=True,
    )
    assert loaded.returncode == 0, loaded.stderr


def test_after_a_restore_no_token_is_issued_again_and_what_was_live_is_ended(acme, tmp_path):
    policy_change(tenant=acme.tenant, document={"require_credential": True}, changed_by="admin", reason="leases")
    credential_create(tenant=acme.tenant, principal=PRINCIPAL, secret_ref="vault:kv/github-bot")
    run = new_run(acme.worker)
    first = leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-a", ttl_s=600).fencing_token
    lent = credential_lease(acme, run, first, PRINCIPAL, actions=["create_issue"], resources=[RESOURCE], ttl_s=600)
    in_flight = _authorized(acme, run, first, "issue:1", lent.pk)
    operations.operation_dispatch(worker=acme.worker, operation_id=in_flight.pk, fencing_token=first)
    waiting = _authorized(acme, run, first, "issue:2", lent.pk)  # authorized, not yet dispatched

    # The fence's row as migration 0036 leaves it (a transactional test's flush removed it): its home.
    FenceGeneration.objects.update_or_create(pk=1, defaults={"home": sql_fence.database_identity()})
    source = connection.settings_dict["NAME"]
    dump = tmp_path / "fenceline.dump"
    taken = _manage(source, "backup", "--output", str(dump), "--label", "before the takeovers")
    assert taken.returncode == 0, taken.stderr

    # After the backup: two takeovers and the credential lease revoked.
    after = [_takeover(acme, run, "owner-b"), _takeover(acme, run, "owner-c")]
    credential_lease_revoke(tenant=acme.tenant, lease_id=lent.pk, revoked_by="admin-ann", reason="leaked in a log")
    seen = set(LeaseGrant.objects.filter(run=run).values_list("fencing_token", flat=True))
    assert seen == {first, *after} and max(seen) == after[-1]

    _restore_in_place(source, dump)
    restored = Run.objects.get(pk=run.pk).lease
    assert (restored.owner_id, restored.fencing_token) == ("owner-a", first)  # the database rolled back
    assert CredentialLease.objects.get(pk=lent.pk).revoked_at is None  # live again

    # Between pg_restore and restore_check the restored image refuses every fenced call: the
    # worker that held the restored lease cannot renew or dispatch under it, and nobody gets
    # a token the rolled-back database would issue again.
    grants = LeaseGrant.objects.count()
    for attempt in (
        lambda: leases.lease_renew(
            worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=first, ttl_s=600
        ),
        lambda: operations.operation_dispatch(worker=acme.worker, operation_id=waiting.pk, fencing_token=first),
        lambda: leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-x", ttl_s=600),
        lambda: _takeover(acme, run, "owner-y"),
    ):
        with pytest.raises(RestoreUnchecked) as unchecked:
            attempt()
        assert (unchecked.value.status, unchecked.value.code) == (503, "RESTORE_UNCHECKED")
    assert LeaseGrant.objects.count() == grants
    assert Operation.objects.get(pk=waiting.pk).phase == "AUTHORIZED"
    before_check = int(time.time())
    check = _manage(source, "restore_check", "--by", "olga")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "fence: generation 0 -> " in check.stdout
    assert "1 run leases ended (1 dispatched operations UNKNOWN with a case), 1 credential leases revoked" in (
        check.stdout
    )
    generation = FenceGeneration.objects.get(pk=1).generation
    assert generation >= before_check

    # The lease held in the backup is ended: its owner is refused, its dispatch is UNKNOWN with a case.
    with pytest.raises(DomainError):
        leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=first, ttl_s=600)
    assert Operation.objects.get(pk=in_flight.pk).phase == "UNKNOWN"
    assert ReconciliationCase.objects.filter(operation_id=in_flight.pk, status="OPEN").count() == 1
    assert CredentialLease.objects.get(pk=lent.pk).revoke_reason == "restore"

    # The next lease on the run: greater than every token seen before the restore.
    token = leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-d", ttl_s=600).fencing_token
    assert token > max(seen) and token == token_floor(generation)
    assert _takeover(acme, run, "owner-e") == token + 1

    # The revoked credential lease is refused, once a person allows effects again.
    effects_allow(tenant="acme", name="olga", reason="restore checked; fence advanced")
    with pytest.raises(Denied) as refused:
        operations.operation_dispatch(worker=acme.worker, operation_id=waiting.pk, fencing_token=token + 1)
    assert refused.value.code == "DENY_REVOKED"
    assert Operation.objects.get(pk=waiting.pk).phase == "DENIED"
    with pytest.raises(Denied) as denied:
        _authorized(acme, run, token + 1, "issue:3", lent.pk)
    assert denied.value.code == "DENY_REVOKED"

    # The chain records the restore and verifies.
    recorded = Event.objects.get(run=run, type="RUN_RESTORED")
    assert (recorded.actor, recorded.fields["generation"], recorded.fields["fencing_token"]) == (
        "system:restore",
        generation,
        first,
    )
    ended = Event.objects.get(run=run, type="LEASE_REVOKED")
    assert ended.fields["reason"] == "restore" and ended.seq > recorded.seq
    verified = ledger_verify(run_ids=[run.pk])
    assert (verified.runs, verified.broken) == (1, 0)
    assert Run.objects.get(pk=run.pk).broken_reason == ""


def test_a_restore_waits_for_an_acquisition_in_progress_and_ends_its_lease(acme):
    FenceGeneration.objects.get_or_create(pk=1)  # as migration 0035 left it (a transaction test's flush drops it)
    run = new_run(acme.worker)
    granted, release = threading.Event(), threading.Event()
    issued: dict = {}

    def acquire_and_wait():
        """An acquisition whose transaction is still open when the restore starts."""
        try:
            with transaction.atomic():
                lease = leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-a", ttl_s=600)
                issued["token"] = lease.fencing_token
                granted.set()
                release.wait(10)
        finally:
            connection.close()

    def restore():
        try:
            issued["restore"] = fence_restore(by="olga")
        finally:
            connection.close()

    holder = threading.Thread(target=acquire_and_wait)
    holder.start()
    assert granted.wait(10)
    restoring = threading.Thread(target=restore)
    restoring.start()
    wait_until_blocked_on_a_lock()  # the restore waits for the acquisition's share of the generation
    release.set()
    holder.join(10)
    restoring.join(10)
    restored = issued["restore"]
    assert (issued["token"], restored.leases_ended) == (1, 1)  # committed under generation 0, then ended
    lease = Run.objects.get(pk=run.pk).lease
    assert (lease.owner_id, lease.end_reason) == (None, "REVOKED")
    again = leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=600)
    assert again.fencing_token == token_floor(restored.generation)
