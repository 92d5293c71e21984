"""Who acts: a console user (whose role on the object's tenant the service re-checks) or,
for existing callers such as reconcilers and tests, a plain name."""

from ledger.models import Tenant
from ledger.roles import can
from ledger.services.errors import Forbidden


def acting_name(*, user, name: str, tenant_id: object, perm: str) -> str:
    """The name to record for the decision; raises Forbidden when ``user`` lacks ``perm``."""
    if user is None:
        return name
    tenant = Tenant.objects.get(pk=tenant_id)
    if not can(user, tenant, perm):
        raise Forbidden("your role on this tenant does not allow this action")
    return user.username
