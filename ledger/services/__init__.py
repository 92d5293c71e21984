"""Every state transition of the ledger is a function in this package, one room per domain.

    core/       the steps every domain takes: the fence (fencing.py), an operation's phase
                change (phases.py), who decided and why (decisions.py), and the hand-over
                to a person (handoff.py, implemented by the approvals app)
    evidence/   the chain: appending events (append.py), the verifier and checkpoints
                (verification.py)
    authority/  policy versions, the authorize/dispatch checks (evaluation.py), capability
                budgets, credentials and credential leases, cost windows, reservations and
                the breaker
    fence/      runs, run leases, operations (intent, authorize, dispatch), outcomes,
                retries, the move to UNKNOWN, workers' own events
    fleet/      worker identities and their lifecycle (drain, quarantine, resume)
    tenancy/    tenants and the roles people hold in them

Dependencies point down that list's reverse: core and evidence import no other room,
authority builds on them, fence on authority, fleet and tenancy on fence and authority.
The approvals app builds on core, evidence and authority, and the fence reaches it only
through core/handoff.py.
"""
