"""What the fleet can read: each worker's build and the newest schema version it reported
reading (its latest boot report). A worker counts as live while it has been seen (any API
call, heartbeat or boot) within ``WORKER_LIVE_S`` and is not STOPPED."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from ledger.models import Worker, WorkerBoot
from ledger.states import WorkerStatus


@dataclass(frozen=True)
class WorkerBuild:
    worker_id: int
    tenant: str
    name: str
    status: str
    last_seen_at: datetime | None
    live: bool
    code_version: str  # "" when it never reported a boot
    reads_up_to: int | None  # the state_schema_version of its latest boot; None: never reported

    def reads(self, version: int) -> bool:
        return self.reads_up_to is not None and self.reads_up_to >= version

    def describe(self) -> str:
        build = f"build {self.code_version}, reads up to v{self.reads_up_to}" if self.reads_up_to else "no boot report"
        return f"{self.tenant}/{self.name} ({build})"


def live_after() -> datetime:
    return timezone.now() - timedelta(seconds=settings.FENCELINE["WORKER_LIVE_S"])


def fleet_builds() -> list[WorkerBuild]:
    """Every registered worker that is not STOPPED, with its latest boot's build."""
    latest = WorkerBoot.objects.filter(worker=OuterRef("pk")).order_by("-reported_at")
    rows = (
        Worker.objects.exclude(status=WorkerStatus.STOPPED)
        .annotate(
            code=Subquery(latest.values("code_version")[:1]), reads=Subquery(latest.values("state_schema_version")[:1])
        )
        .select_related("tenant")
        .order_by("tenant__slug", "name")
    )
    since = live_after()
    return [
        WorkerBuild(
            worker_id=w.pk,
            tenant=w.tenant.slug,
            name=w.name,
            status=w.status,
            last_seen_at=w.last_seen_at,
            live=w.last_seen_at is not None and w.last_seen_at >= since,
            code_version=w.code or "",
            reads_up_to=w.reads,
        )
        for w in rows
    ]


def behind(version: int, *, live_only: bool = True) -> list[WorkerBuild]:
    """Workers (live ones, or every registered one) whose build does not read ``version``."""
    return [b for b in fleet_builds() if (b.live or not live_only) and not b.reads(version)]
