"""Who acted: the one spelling of every actor string in the chain and the admin records.

An actor is ``worker:<worker name>/<owner id>`` for a worker's fenced call,
``user:<username>`` for a person's decision (invariant 8), ``reconciler:<name>`` for a
provider lookup that settled an UNKNOWN, ``provider:<source>`` for a provider's signed
webhook, or ``system:<job>`` for one of Fenceline's own jobs. Actors are stored with every event, so what a worker names itself
passes the secret boundary first.
"""

from typing import Protocol

from ledger.boundary import check_text

SYSTEM = "system"  # Fenceline itself, e.g. the starter policy it gives a new tenant
SYSTEM_REAPER = "system:lease-reaper"
SYSTEM_DRAIN = "system:drain"
SYSTEM_LIMITS = "system:run-limits"
SYSTEM_RESOURCE_REAPER = "system:resource-reaper"
SYSTEM_APPROVAL_EXPIRY = "system:approval-expiry"
SYSTEM_RESERVATION_EXPIRY = "system:reservation-expiry"
SYSTEM_RESTORE = "system:restore"
SYSTEM_CASE_TIMERS = "system:case-timers"  # claims that expire, unclaimed cases that escalate


class Named(Protocol):
    name: str


def worker_actor(worker: Named, owner_id: str) -> str:
    check_text(owner_id, path="owner_id")  # the actor is stored with every event
    return f"worker:{worker.name}/{owner_id}"


def user_actor(username: str) -> str:
    return f"user:{username}"


def provider_actor(source: str) -> str:
    """A provider's signed webhook (``FENCELINE_DELIVERY_SOURCES``): it holds no lease and
    presents no fencing token; its signature under the source's secret is its credential."""
    return f"provider:{source}"


def reconciler_actor(name: str) -> str:
    """A reconciler's settlement: also the case's ``resolved_by`` (the source ``reconciler:<name>``)."""
    return f"reconciler:{name}"
