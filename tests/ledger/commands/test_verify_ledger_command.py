import pytest
from django.core.management import CommandError, call_command

from ledger.models import Checkpoint, Run
from ledger.services.fence import runs
from tests.factories import leased_run
from tests.helpers import tampering


def test_verify_ledger_seals_pending_runs_and_reports_each(acme, capsys, settings):
    settings.FENCELINE = {**settings.FENCELINE, "CHECKPOINT_EVERY": 2}
    first, token = leased_run(acme.worker)
    runs.run_complete(worker=acme.worker, run_id=first.pk, fencing_token=token)
    second, _ = leased_run(acme.worker)
    call_command("verify_ledger")
    out = capsys.readouterr().out
    assert f"run {first.pk}: VERIFIED to checkpoint {Run.objects.get(pk=first.pk).last_seq}" in out
    assert f"run {second.pk}: VERIFIED to checkpoint 2" in out
    assert "verified 2 runs" in out and "0 BROKEN" in out
    # Nothing moved: nothing pending the second time.
    call_command("verify_ledger")
    assert "verified 0 runs" in capsys.readouterr().out


def test_verify_ledger_exits_non_zero_on_a_broken_chain(acme, capsys):
    run, _ = leased_run(acme.worker)
    with tampering() as cursor:
        cursor.execute("DELETE FROM ledger_event WHERE run_id = %s AND seq = 1", [run.pk])
    with pytest.raises(SystemExit) as exited:
        call_command("verify_ledger", "--run", str(run.pk))
    assert exited.value.code == 1
    assert "BROKEN at seq 1..1: gap" in capsys.readouterr().out
    assert not Checkpoint.objects.filter(run=run).exists()


def test_verify_ledger_names_an_unknown_run(db):
    with pytest.raises(CommandError, match="no such run: nope"):
        call_command("verify_ledger", "--run", "nope")


def test_verify_ledger_task_verifies_pending_runs_and_is_safe_to_repeat(acme, settings):
    from ledger.tasks import verify_ledger_task

    settings.FENCELINE = {**settings.FENCELINE, "CHECKPOINT_EVERY": 2}
    run, _ = leased_run(acme.worker)
    assert verify_ledger_task.apply().get() == {"runs": 1, "events": 2, "broken": 0}
    assert list(Checkpoint.objects.filter(run=run).values_list("seq", flat=True)) == [2]
    assert verify_ledger_task.apply().get() == {"runs": 0, "events": 0, "broken": 0}
    assert verify_ledger_task.apply(args=[str(run.pk)]).get() == {"runs": 1, "events": 2, "broken": 0}
    assert Checkpoint.objects.filter(run=run).count() == 1


def test_verify_ledger_reports_a_forged_event_without_a_mac_at_its_seq(acme, capsys):
    from ledger.models import Event
    from ledger.services.evidence.append import build_event

    run, _ = leased_run(acme.worker)
    run = Run.objects.get(pk=run.pk)
    forged = build_event(run, type="NOTE", actor="worker:intruder/x", fields={}, occurred_at=run.created_at)
    forged.mac_key_id = forged.mac = ""  # hashed and linked correctly, but not by the event key's holder
    Event.objects.bulk_create([forged])
    Run.objects.filter(pk=run.pk).update(last_seq=forged.seq, last_hash=forged.hash)
    with pytest.raises(SystemExit) as exited:
        call_command("verify_ledger", "--run", str(run.pk))
    assert exited.value.code == 1
    assert f"BROKEN at seq {forged.seq}..{forged.seq}: mac_missing" in capsys.readouterr().out
    run = Run.objects.get(pk=run.pk)
    assert (run.broken_reason, run.broken_first_seq) == ("mac_missing", forged.seq)
