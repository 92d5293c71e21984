"""What ``manage.py demo`` seeds, through the real services, one module per story:

- ``seed``: the order of it all, the demo tenant, its users and their roles;
- ``acting``: a worker's calls (lease, intend, dispatch, report) as the stories make them;
- ``runs``: effects confirmed, fenced by a takeover, timed out, a chain made BROKEN;
- ``lookups``: lost answers looked up at the sandbox provider before people;
- ``upgrade``: the upgrade window of ``operation.provider_ref`` with a state conflict;
- ``approvals``: payments before a person, one request pending and one expired;
- ``gateway``: an MCP session through ``fenceline-mcp``, a push waiting for a person;
- ``adapters``: an OpenAI Agents SDK run (a refund waiting for a person) and a LangGraph run
  (progress checkpoints in the adapter's shape), as the framework adapters write them;
- ``credentials``: a revoked credential lease that refused a dispatch, live ones to revoke;
- ``workers``: a worker quarantined after a lost lease, another draining;
- ``lifespan``: resources a vanished worker left, a cleanup that keeps failing, a cancellation;
- ``tenants``: the other tenants (one the demo users never see, one with its breaker DEGRADED);
- ``webhooks``: an endpoint at the sandbox's sink and the first deliveries.
"""
