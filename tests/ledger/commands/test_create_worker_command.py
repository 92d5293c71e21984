import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from ledger.models import Tenant, Worker
from ledger.selectors import worker_for_token


def test_create_worker_prints_a_working_token_alone_on_the_last_line(db, capsys):
    call_command("create_worker", "--tenant", "newco", "--name", "agent-1")
    lines = capsys.readouterr().out.strip().splitlines()
    token = lines[-1]
    assert token.startswith("flw_") and " " not in token
    assert Tenant.objects.filter(slug="newco").exists()
    assert worker_for_token(token).name == "agent-1"
    # Only the digest is stored.
    assert not Worker.objects.filter(token_hash__contains=token).exists()


def test_create_worker_refuses_a_duplicate_name_with_a_one_line_reason(db):
    call_command("create_worker", "--tenant", "newco", "--name", "agent-1")
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_worker", "--tenant", "newco", "--name", "agent-1")


def test_create_worker_exits_non_zero_on_a_bad_tenant_slug():
    result = subprocess.run(
        [sys.executable, "manage.py", "create_worker", "--tenant", "Not A Slug", "--name", "w"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "tenant must be a slug" in result.stderr


def test_create_worker_refuses_a_name_that_looks_like_a_credential(db):
    with pytest.raises(CommandError, match="credential-like"):
        call_command("create_worker", "--tenant", "newco", "--name", "ghp_" + "a" * 36)
    assert not Worker.objects.exists()
