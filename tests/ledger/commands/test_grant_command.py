import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger.roles import ADMINISTER, APPROVE, OPERATE, VIEW, can, tenants_for


def test_grant_creates_the_user_and_gives_exactly_the_role(acme, outsider, capsys):
    call_command("grant", "--user", "olivia", "--tenant", "acme", "--role", "operator", "--password", "pw-olivia-1")
    olivia = get_user_model().objects.get(username="olivia")
    assert olivia.check_password("pw-olivia-1")
    assert [can(olivia, acme.tenant, p) for p in (VIEW, OPERATE, APPROVE, ADMINISTER)] == [True, True, False, False]
    assert list(tenants_for(olivia)) == [acme.tenant]  # nothing of globex
    call_command("grant", "--user", "olivia", "--tenant", "acme", "--role", "viewer")
    olivia = get_user_model().objects.get(username="olivia")
    assert [can(olivia, acme.tenant, p) for p in (VIEW, OPERATE)] == [True, False]
    assert "updated user olivia: viewer on acme" in capsys.readouterr().out


def test_grant_refuses_an_unknown_tenant(db):
    with pytest.raises(CommandError, match="no such tenant: nope"):
        call_command("grant", "--user", "x", "--tenant", "nope", "--role", "viewer")
