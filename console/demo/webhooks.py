"""A webhook of the demo tenant to the sandbox's sink, for every kind of notification: one
scan and one delivery pass now (the approval, the quarantine, the cleanup alert and the
BROKEN chain seeded before), the jobs deliver the rest while the demo runs (the UNKNOWNs, once
they are a minute old)."""

from collections.abc import Callable

from approvals.services.notifications import notifications_scan
from console.simulation.provider import SandboxProvider
from ledger.models import Tenant
from ledger.models.notifications import NotificationKind
from ledger.services.notifications.delivery import deliveries_send
from ledger.services.notifications.endpoints import endpoint_create


def seed(tenant: Tenant, sandbox: SandboxProvider, say: Callable[[str], None]) -> None:
    endpoint_create(
        tenant=tenant,
        name="ops-channel",
        target=sandbox.url + "/v1/webhooks",
        kinds=NotificationKind.values,
        unknown_after_s=60,
        reason="the on-call channel (the sandbox's sink in the demo)",
        created_by="admin",
    )
    scanned = notifications_scan()
    sent = deliveries_send()
    say(
        f"webhooks: {scanned.created} notification(s) for ops-channel, {sent.delivered} delivered to the "
        f"sandbox sink ({sum(1 for w in sandbox.webhooks if w['signed'])} signed)"
    )
