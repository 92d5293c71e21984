"""Fixtures of the ledger's service tests, beyond the cast of tests/conftest.py."""

import pytest

from tests.factories import credential


@pytest.fixture
def bot(acme):
    """acme's credential of the principal github-bot, at version 1."""
    return credential(acme.tenant)
