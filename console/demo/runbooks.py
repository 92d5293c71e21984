"""The demo tenant's runbooks: what to check at the provider for each reason a case is
opened for and each verdict a reconciler gives, as an admin would write them."""

from collections.abc import Callable

from ledger.models import Tenant
from ledger.services.tenancy.runbooks import runbook_set

REASON_LEASE_LOST = """The worker lost its lease **after** it dispatched the call: the call may have run.

1. Open the run and find the operation's *idempotency key*.
2. Search the provider's dashboard (payments: *Payments → search by idempotency key*) for it.
3. Found with a request id → resolve **happened** with that id. Not found after 15 minutes → **did not happen**.

Do not retry from here: a NON_RETRYABLE retry needs an approval."""

REASON_LEASE_RELEASED = """The worker gave its lease up with this effect still in flight (a drain or a clean stop).

- Check the worker's last boot report on its page: did it say it left effects in doubt?
- Then look the call up at the provider by its idempotency key, as for `LEASE_LOST`."""

REASON_LEASE_REVOKED = """An admin revoked the lease (or a drain deadline passed) after dispatch.

- Read the *Admin decisions* on the tenant page for who and why.
- Look the call up at the provider; if a credential was rotated, the call most likely failed with 401: **did not happen**."""

REASON_RUN_CANCELLED = """The run was cancelled while this effect was in flight.

- Cancelling stops the agent, not the provider: look the call up by its idempotency key.
- If it happened and should not have, **compensate** (refund, delete) and resolve **compensated**."""

REASON_WORKER_REPORTED_UNKNOWN = """The worker itself could not tell (a timeout or a dropped connection).

- Its evidence column may hold a provider request id reported by a worker whose lease had been taken over; verify it at the provider before you use it.
- Escalate to an admin if the provider's status page shows an incident."""

VERDICT_CANNOT_TELL = """The reconciler asked the provider and could not read an answer it trusts (a status in none of the configured lists).

- Open *lookup: what was asked* to see the request and the status seen.
- Ask in `#payments-oncall` before resolving by hand."""

VERDICT_PENDING = """The provider says the call is still being processed: the reconciler will ask again. Nothing to do unless it stays pending for an hour."""

# Each runbook: its subject, the reason or verdict it is for, and its Markdown.
RUNBOOKS: list[tuple[str, str, str]] = [
    ("reason", "LEASE_LOST", REASON_LEASE_LOST),
    ("reason", "LEASE_RELEASED", REASON_LEASE_RELEASED),
    ("reason", "LEASE_REVOKED", REASON_LEASE_REVOKED),
    ("reason", "RUN_CANCELLED", REASON_RUN_CANCELLED),
    ("reason", "WORKER_REPORTED_UNKNOWN", REASON_WORKER_REPORTED_UNKNOWN),
    ("verdict", "CANNOT_TELL", VERDICT_CANNOT_TELL),
    ("verdict", "PENDING", VERDICT_PENDING),
]


def seed(tenant: Tenant, say: Callable[[str], None]) -> None:
    for subject, name, text in RUNBOOKS:
        runbook_set(tenant=tenant, subject=subject, name=name, text=text, reason="the demo's runbooks", set_by="admin")
    say(f"wrote {len(RUNBOOKS)} runbooks for tenant {tenant.slug}")
