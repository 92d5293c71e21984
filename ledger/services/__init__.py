"""Every state transition of the ledger is a function in this package."""
