"""Fenced runs: creation and completion, run leases, operations from intent to outcome, retries, the move to UNKNOWN."""
