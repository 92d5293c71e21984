"""The ``count-run-totals`` job: what each tenant's runs add up to, counted in one pass over
every run (``ledger.observability.totals.run_totals_count``) and kept in
:class:`~ledger.models.RunTotals`, so that a ``/metrics`` scrape reads one row per tenant."""

from ledger.models import RunTotals
from ledger.observability.totals import TOTALS, run_totals_count


def run_totals_store() -> int:
    """The job: count, and store the count (one row per tenant with runs; runs are never
    deleted). Returns the number of tenants counted."""
    counted = run_totals_count()
    RunTotals.objects.bulk_create(
        counted, update_conflicts=True, unique_fields=["tenant"], update_fields=[*TOTALS, "counted_at"]
    )
    return len(counted)
