import sys
import time
import uuid

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fenceline_client.evidence_verifier import Report
from ledger.models import Run
from ledger.services.evidence.verification import LedgerResult, ledger_verify, run_verify


class Command(BaseCommand):
    help = "Verify runs' evidence chains and seal checkpoints. Exits 1 when a chain is BROKEN."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run", action="append", dest="runs", metavar="ID", help="verify this run (repeatable)")
        parser.add_argument("--limit", type=int, default=None, help="at most this many pending runs")

    def handle(self, *args: object, runs: list[str] | None = None, limit: int | None = None, **options: object) -> None:
        started = time.monotonic()

        def on_events(count: int) -> None:
            rate = count / max(time.monotonic() - run_started, 1e-9)
            self.stderr.write(f"\r  {count:,} events ({rate:,.0f}/s)", ending="")
            self.stderr.flush()

        def show(result: LedgerResult, report: Report) -> None:
            if report.events_checked >= 50_000:
                self.stderr.write("")
            self.stdout.write(f"run {report.run_id}: {describe(report)}")

        if runs:
            for run_id in runs:
                if not _is_uuid(run_id) or not Run.objects.filter(pk=run_id).exists():
                    raise CommandError(f"no such run: {run_id}")
            result = LedgerResult()
            for run_id in runs:
                run_started = time.monotonic()
                report = run_verify(run_id=run_id, on_events=on_events)
                result.runs += 1
                result.events += report.events_checked
                result.broken += report.finding is not None
                show(result, report)
        else:
            run_started = time.monotonic()
            result = ledger_verify(limit=limit, progress=show)
        elapsed = time.monotonic() - started
        self.stdout.write(
            f"verified {result.runs} runs, {result.events:,} events in {elapsed:.1f}s; {result.broken} BROKEN"
        )
        if result.broken:
            self.stderr.write(f"{result.broken} run(s) BROKEN: see the lines above")
            sys.exit(1)


def describe(report: Report) -> str:
    if report.finding is not None:
        f = report.finding
        return f"BROKEN at seq {f.first_seq}..{f.last_seq}: {f.reason} ({f.detail}); last trusted checkpoint {report.last_trusted_checkpoint}"
    if report.status == "VERIFIED":
        verdict = f"VERIFIED to checkpoint {report.last_trusted_checkpoint} ({report.events_checked} events)"
    else:
        verdict = f"UNSEALED: head {report.head_seq}, last checkpoint {report.last_trusted_checkpoint}"
    if report.payloads_removed:
        seqs = ", ".join(map(str, report.payloads_removed_seqs))
        more = ", ..." if report.payloads_removed > len(report.payloads_removed_seqs) else ""
        verdict += f"; {report.payloads_removed} payload removed by retention (seq {seqs}{more})"
    return verdict


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
