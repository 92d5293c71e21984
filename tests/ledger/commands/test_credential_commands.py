"""The credential management commands (create_credential, rotate_credential,
revoke_credential_leases) over the same services: one-line refusals that never echo a secret,
a dry run that changes nothing."""

import pytest
from django.core.management import CommandError, call_command

from ledger.models import Credential, CredentialLease
from tests.factories import GITHUB_PAT, SECRET_REF, credential_lease, leased_run
from tests.helpers import events_of

# --- management commands ------------------------------------------------------------------


def test_create_credential_command_prints_the_reference(acme, capsys):
    call_command("create_credential", "--tenant", "acme", "--principal", "github-bot", "--secret-ref", SECRET_REF)
    assert "created credential github-bot version 1" in capsys.readouterr().out
    assert Credential.objects.get(tenant=acme.tenant).secret_ref == SECRET_REF


def test_create_credential_command_refuses_a_secret_in_one_line_without_echoing_it(acme):
    with pytest.raises(CommandError) as refused:
        call_command("create_credential", "--tenant", "acme", "--principal", "github-bot", "--secret-ref", GITHUB_PAT)
    assert "\n" not in str(refused.value) and GITHUB_PAT not in str(refused.value)
    assert not Credential.objects.exists()


def test_commands_refuse_an_unknown_tenant(db):
    with pytest.raises(CommandError, match="no tenant"):
        call_command("create_credential", "--tenant", "nope", "--principal", "p", "--secret-ref", SECRET_REF)
    with pytest.raises(CommandError, match="no tenant"):
        call_command("rotate_credential", "--tenant", "nope", "--principal", "p", "--by", "a", "--reason", "r")


def test_rotate_credential_command(acme, bot, capsys):
    run, token = leased_run(acme.worker)
    credential_lease(acme, run, token)
    call_command(
        "rotate_credential", "--tenant", "acme", "--principal", "github-bot", "--by", "alice", "--reason", "leak"
    )
    out = capsys.readouterr().out
    assert "to version 2" in out and "1 run(s)" in out and str(run.pk) in out
    with pytest.raises(CommandError, match="no credential"):
        call_command("rotate_credential", "--tenant", "acme", "--principal", "nobody", "--by", "alice", "--reason", "r")


def test_revoke_command_dry_run_prints_what_it_would_revoke_and_changes_nothing(acme, bot, capsys):
    run, token = leased_run(acme.worker)
    lease = credential_lease(acme, run, token)
    base = ["revoke_credential_leases", "--tenant", "acme", "--by", "alice", "--reason", "r"]

    call_command(*base, "--principal", "github-bot", "--dry-run")
    out = capsys.readouterr().out
    assert str(lease.pk) in out and "would revoke 1 lease(s)" in out
    assert CredentialLease.objects.get().revoked_at is None
    assert events_of(run, "CREDENTIAL_LEASE_REVOKED") == []

    call_command(*base, "--prefix", str(lease.pk)[:8])
    out = capsys.readouterr().out
    assert str(lease.pk) in out and "revoked 1 lease(s)" in out
    assert CredentialLease.objects.get().revoked_by == "alice"

    call_command(*base, "--lease", str(lease.pk))
    assert "revoked 0 lease(s)" in capsys.readouterr().out
    assert len(events_of(run, "CREDENTIAL_LEASE_REVOKED")) == 1


def test_revoke_command_by_lease_id(acme, bot, capsys):
    run, token = leased_run(acme.worker)
    lease = credential_lease(acme, run, token)
    base = ["revoke_credential_leases", "--tenant", "acme", "--by", "alice", "--reason", "r"]
    call_command(*base, "--lease", str(lease.pk), "--dry-run")
    assert "would revoke 1 lease(s)" in capsys.readouterr().out
    call_command(*base, "--lease", str(lease.pk))
    assert "revoked 1 lease(s)" in capsys.readouterr().out
    assert CredentialLease.objects.get().revoked_at is not None


def test_revoke_command_refuses_a_short_prefix_and_needs_exactly_one_selector(acme, bot):
    base = ["revoke_credential_leases", "--tenant", "acme", "--by", "alice", "--reason", "r"]
    with pytest.raises(CommandError, match="at least 4 hex digits"):
        call_command(*base, "--prefix", "ab")
    with pytest.raises(CommandError):
        call_command(*base)
    with pytest.raises(CommandError):
        call_command(*base, "--principal", "github-bot", "--prefix", "abcd")
