"""Authority at dispatch: tenant policy, capability budgets, credentials and credential leases, cost budgets and the breaker."""
