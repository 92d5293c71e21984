"""Every state transition of the ledger is a function in this package, one room per domain.

    evidence/   the chain: appending events (append.py), the verifier and checkpoints
                (verification.py)
    operating/  running Fenceline itself: the jobs' heartbeats, sweeps in several processes,
                the run totals job
    core/       the steps every domain takes: the fence (fencing.py), an operation's phase
                change (phases.py), an intent as a worker states it (intent.py), who decided
                and why (decisions.py), and the hand-over to a person (handoff.py,
                implemented by the approvals app)
    authority/  policy versions, the authorize/dispatch checks (evaluation.py), capability
                budgets, credentials and credential leases, cost windows, reservations and
                the breaker
    upgrades/   schema changes by phase, backfills, state conflicts, the restore check
    notifications/  webhook endpoints, their bodies and deliveries
    lifespan/   instances, progress checkpoints, resources and their reaper
    reconciliation/  tool contracts at intent, reconcilers and their registry
    fence/      runs, run leases, operations (intent, authorize, dispatch), outcomes,
                retries, the move to UNKNOWN, workers' own events
    fleet/      worker identities and their lifecycle (drain, quarantine, resume)
    tenancy/    tenants and the roles people hold in them

A room imports only rooms above it in that list (the layers of the import contracts in
pyproject.toml): evidence and operating import no other room; core builds on evidence;
authority, upgrades and notifications on core; lifespan on authority, reconciliation on
upgrades; fence on both; fleet on fence; tenancy on authority. The approvals app builds on
all of them, and they reach it only through core/handoff.py.
"""
