"""Reads of credentials with the lock an issue of a credential lease takes."""

from functools import cache

from ledger.models import Credential
from ledger.sql.connection import execute
from ledger.sql.rows import from_row, prep, select_sql


@cache
def _for_share_sql() -> str:
    sql, _ = select_sql(Credential, ("tenant_id", "principal"))
    return f"{sql} FOR SHARE"


def credential_for_share(*, tenant_id: object, principal: str) -> Credential | None:
    """The tenant's credential ``principal``, its row locked FOR SHARE until the transaction
    ends: a rotation (which locks it FOR UPDATE) waits for the issue to commit, or the issue
    waits for the rotation; issues do not block each other."""
    values = [prep(Credential, "tenant_id", tenant_id), prep(Credential, "principal", principal)]
    row = execute(_for_share_sql(), values).fetchone()
    return None if row is None else from_row(Credential, row)
