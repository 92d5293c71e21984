"""Reconciliation by provider lookup: the reconciler protocol, the configured reconcilers
(``registry``), the HTTP reconciler (``http``). The job that claims UNKNOWN operations and
settles them is approvals' (``approvals/services/lookups.py``): it owns the cases."""
