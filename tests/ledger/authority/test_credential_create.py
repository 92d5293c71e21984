"""Creating a credential (ledger/services/authority/credentials.py): only a reference to the
secret is kept, at version 1; a secret-looking value, a value that is no reference, a second
credential of a principal and a bad principal are refused."""

import pytest

from ledger.errors import ForbiddenField, InvalidInput
from ledger.models import Credential
from ledger.services.authority import credentials
from tests.factories import GITHUB_PAT, SECRET_REF

# --- create -------------------------------------------------------------------------------


def test_create_keeps_only_the_reference_at_version_1(acme):
    credential = credentials.credential_create(tenant=acme.tenant, principal="github-bot", secret_ref=SECRET_REF)
    credential.refresh_from_db()
    assert (credential.principal, credential.version, credential.secret_ref) == ("github-bot", 1, SECRET_REF)
    assert credential.rotated_at is None


@pytest.mark.parametrize(
    "secret_ref",
    [
        GITHUB_PAT,
        "vault:" + GITHUB_PAT,
        "https://deploy:hunter2@vault.example.com/kv",
        "env:API_KEY=abcdef123",
        "sk-proj-" + "x1" * 20,
    ],
)
def test_create_refuses_a_secret_looking_reference_without_echoing_it(acme, secret_ref):
    with pytest.raises(ForbiddenField) as refused:
        credentials.credential_create(tenant=acme.tenant, principal="github-bot", secret_ref=secret_ref)
    assert refused.value.path == "secret_ref"
    assert secret_ref not in refused.value.detail
    assert not Credential.objects.exists()


@pytest.mark.parametrize("secret_ref", ["hunter2", "", "vault:", "Vault:kv/x", "vault:kv/has space"])
def test_create_refuses_a_value_that_is_not_a_reference(acme, secret_ref):
    with pytest.raises(InvalidInput, match="secret_ref"):
        credentials.credential_create(tenant=acme.tenant, principal="github-bot", secret_ref=secret_ref)
    assert not Credential.objects.exists()


def test_create_refuses_a_second_credential_for_the_same_principal(acme, bot, outsider):
    with pytest.raises(InvalidInput, match="already exists"):
        credentials.credential_create(tenant=acme.tenant, principal="github-bot", secret_ref="vault:kv/other")
    # Another tenant may use the same principal name.
    assert (
        credentials.credential_create(tenant=outsider.tenant, principal="github-bot", secret_ref=SECRET_REF).version
        == 1
    )


@pytest.mark.parametrize("principal", [GITHUB_PAT, "has space", "", "-leading-dash", "x" * 201])
def test_create_refuses_a_bad_principal(acme, principal):
    with pytest.raises((InvalidInput, ForbiddenField)):
        credentials.credential_create(tenant=acme.tenant, principal=principal, secret_ref=SECRET_REF)
