"""What the periodic jobs last did, one row per job: written by every run of a job, read by
``/readyz`` (is each job fresh?) and ``/metrics`` (runs, failures, cumulative counts). The
database holds it so that the answer is the same whichever web or Celery process asks."""

from django.db import models

from ledger.versioning import Versioned


class JobHeartbeat(Versioned):
    name = models.CharField(primary_key=True, max_length=64)  # the beat entry, e.g. "reap-leases"
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)  # the last run that succeeded
    last_failed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=200, blank=True)  # the exception's type, never its message
    last_duration_ms = models.PositiveIntegerField(default=0)
    runs = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveBigIntegerField(default=0)
    # What the job's runs have done, summed: {"leases": 12, "operations": 3}.
    totals = models.JSONField(default=dict)

    class Meta:
        ordering = ["name"]


class RunTotals(Versioned):
    """What each tenant's runs add up to, as the run-totals job last counted them: one pass
    over every run, done by the job so that a ``/metrics`` scrape reads a row per tenant
    instead (``ledger/services/operating/totals.py``)."""

    tenant = models.OneToOneField("ledger.Tenant", on_delete=models.CASCADE, primary_key=True, related_name="+")
    accepted = models.PositiveBigIntegerField(default=0)  # events accepted: the sum of every chain's head seq
    broken = models.PositiveBigIntegerField(default=0)  # runs the verifier found BROKEN
    lag = models.BigIntegerField(default=0)  # events beyond each run's last verified checkpoint
    unknown = models.PositiveBigIntegerField(default=0)  # operations in UNKNOWN
    active = models.PositiveBigIntegerField(default=0)  # runs in status ACTIVE
    in_flight = models.PositiveBigIntegerField(default=0)  # operations AUTHORIZED or DISPATCHED
    verified_at = models.DateTimeField(null=True, blank=True)  # the newest verification of a run
    counted_at = models.DateTimeField()
