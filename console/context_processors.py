"""What every console page's frame shows about the signed-in user: their role on each
tenant (the top bar's badges) and, on a page whose actions a role hides, one line saying
who may act there. Both are lazy: a partial that never reads them costs no query."""

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from ledger.roles import ACTORS_OF, ADMINISTER, APPROVE, OPERATE, ROLES, roles_of

# The pages whose actions need a role beyond viewing: path prefix -> (permission, what it allows).
ACTIONS_ON: tuple[tuple[str, str, str], ...] = (
    ("/cases/", OPERATE, "claim and resolve cases"),
    ("/approvals/", APPROVE, "approve or deny requests"),
    ("/credentials/", ADMINISTER, "revoke and rotate credentials"),
    ("/workers/", ADMINISTER, "drain and quarantine workers"),
    ("/runs/", OPERATE, "cancel runs and verify their chains"),
)


def role_line(path: str, roles: list[tuple[Any, str]]) -> str:
    """ "Operators and admins of acme may claim and resolve cases (you are a viewer there)."
    for the tenants where the user's role hides this page's actions; "" where it hides none."""
    for prefix, perm, what in ACTIONS_ON:
        if not path.startswith(prefix):
            continue
        lacking = [(tenant, role) for tenant, role in roles if perm not in ROLES[role]]
        if not lacking:
            return ""
        slugs = ", ".join(str(tenant.slug) for tenant, _ in lacking)
        mine = sorted({role for _, role in lacking})
        return f"{ACTORS_OF[perm]} of {slugs} may {what} (you are {' / '.join(mine)} there)."
    return ""


def console_roles(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    roles = SimpleLazyObject(lambda: roles_of(user))
    return {
        "my_roles": roles,
        "role_line": SimpleLazyObject(lambda: role_line(request.path, list(roles))),
    }
