"""Tenants and who may act in them: a tenant on its starter policy, roles granted per tenant."""
