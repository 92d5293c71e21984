"""The demo's seed: the demo tenant, its two workers (one the stories act as, one whose token
the demo prints) and console users, then every story in the order the console shows them best
(later stories build on the policy earlier ones set)."""

from collections.abc import Callable

from console.demo import (
    adapters,
    approvals,
    credentials,
    gateway,
    lifespan,
    lookups,
    runbooks,
    runs,
    tenants,
    triage,
    upgrade,
    webhooks,
    workers,
)
from console.demo.acting import Acting
from console.simulation.provider import SandboxProvider
from ledger.models import Worker
from ledger.services.evidence.verification import ledger_verify
from ledger.services.fleet.workers import worker_create, worker_rotate_token
from ledger.services.tenancy.roles import role_grant
from ledger.services.tenancy.tenants import tenant_ensure

TENANT = "demo"
# The worker whose token the demo prints: it starts with nothing in doubt, so the docs' example
# workers run against the demo as written (a worker whose boot finds effects it left in doubt
# takes no lease until they are decided: 409 RECONCILE_FIRST).
WORKER = "demo-worker"
# The worker the seeded stories act as: their runs, their takeovers and their effects in doubt.
AGENT = "demo-agent"


def seed(sandbox: SandboxProvider, say: Callable[[str], None]) -> str:
    """Seed once, through the services; returns the demo worker's bearer token (a new one at
    every start: a seeded database keeps its data and only the token is rotated)."""
    tenant, _ = tenant_ensure(slug=TENANT, name="Demo tenant")
    existing = Worker.objects.filter(tenant=tenant, name=WORKER).first()
    if existing is not None:
        show_users(say)
        return worker_rotate_token(worker=existing)
    agent, _ = worker_create(tenant=tenant, name=AGENT)
    _, token = worker_create(tenant=tenant, name=WORKER)
    say("seeding demo tenants, users and runs through the services ...")
    for username, role in tenants.USERS:
        role_grant(username=username, tenant=tenant, role=role, password=f"{username}-demo")
    stories(Acting(agent), sandbox, say)
    tenants.seed()
    result = ledger_verify(limit=1000)
    say(f"verified {result.runs} runs ({result.broken} BROKEN, as seeded)")
    webhooks.seed(tenant, sandbox, say)
    runbooks.seed(tenant, say)
    show_users(say)
    return token


def stories(acting: Acting, sandbox: SandboxProvider, say: Callable[[str], None]) -> None:
    runs.confirmed(acting)
    runs.takeover(acting)
    runs.timed_out(acting)
    triage.seed(acting)  # a group of similar cases, and one the case timers escalated
    runs.stuck(acting)
    lookups.seed(acting, sandbox, say)
    upgrade.seed(acting, say)
    approvals.seed(acting)  # from here on, payments need a person and have a contract
    gateway.seed(acting, say)  # an MCP session through fenceline-mcp; git pushes need a person too
    adapters.seed(acting, say)  # an OpenAI Agents SDK run and a LangGraph run; refunds need a person
    credentials.revoked(acting)
    runs.broken(acting)
    credentials.live(acting)
    workers.seed(acting)
    lifespan.seed(acting)


def show_users(say: Callable[[str], None]) -> None:
    say("Console users (password = <user>-demo), on tenants 'demo' and 'initech':")
    for username, role in tenants.USERS:
        say(f"  {username:<9} {role}")
    say("  globex-admin admin on tenant 'globex' only (sees nothing of 'demo')")
