"""Console fixtures: signed-in test clients of the cast (tests/conftest.py) and of the
people a console test needs besides it."""

import pytest

from tests.factories import user_with
from tests.helpers import logged_in


@pytest.fixture
def viewer_client(viewer):
    return logged_in(viewer)


@pytest.fixture
def roleless_client(acme, outsider):
    """A signed-in user with no role anywhere."""
    return logged_in(user_with(None, acme.tenant, "nobody"))


@pytest.fixture
def outsider_viewer_client(outsider):
    """A viewer of the other tenant (globex) only."""
    return logged_in(user_with("viewer", outsider.tenant, "gwen"))
