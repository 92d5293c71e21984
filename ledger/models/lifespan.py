"""What a run keeps so that it can outlive the worker holding it: progress checkpoints."""

import uuid

from django.db import models
from django.db.models import Q

from ledger.models.runs import Run
from ledger.versioning import Versioned


class ProgressCheckpoint(Versioned):
    """Where a run's work stood, saved by its lease owner under the fence; the latest is
    handed to whoever takes the lease next, so a replacement resumes instead of starting
    over. ``state`` passed the secret boundary; the chain records its digest."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="progress_checkpoints")
    seq = models.PositiveIntegerField()  # 1, 2, ... per run
    position = models.CharField(max_length=200)
    state = models.JSONField(default=dict)
    digest = models.CharField(max_length=71)
    fencing_token = models.BigIntegerField()
    owner_id = models.CharField(max_length=200)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="progress_checkpoint_unique_seq_per_run"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="progress_checkpoint_seq_positive"),
        ]
        ordering = ["run", "seq"]
