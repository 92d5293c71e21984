"""`manage.py upgrade`: where each schema change stands, and the moves between its phases
(docs/operations.md "Upgrades"). `upgrade status` lists the changes, their backfills, the
records at each version and the fleet's builds; `upgrade migrate NAME --reason ...` and
`upgrade contract NAME --reason ...` move a change one phase forward (refused, with every
reason, while a precondition does not hold); `upgrade expand NAME` rolls MIGRATE back."""

import sys

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.errors import DomainError
from ledger.models import Backfill, SchemaChange, StateConflict
from ledger.services.upgrades.changes import change_move, change_preconditions, records_behind
from ledger.services.upgrades.fleet import fleet_builds
from ledger.states import ConflictStatus, UpgradePhase

MOVES = {"expand": UpgradePhase.EXPAND, "migrate": UpgradePhase.MIGRATE, "contract": UpgradePhase.CONTRACT}


class Command(BaseCommand):
    help = "Show the schema changes, or move one to its next phase (expand / migrate / contract)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["status", *MOVES], help="status, or the phase to move to")
        parser.add_argument("name", nargs="?", help="the schema change, e.g. operation.provider_ref")
        parser.add_argument("--reason", default="", help="why (required for a move)")
        parser.add_argument("--by", default="", help="who decides (recorded; default: the command)")
        parser.add_argument("--check", action="store_true", help="only say whether the move may happen")

    def handle(
        self, *args: object, action: str, name: str | None, reason: str, by: str, check: bool, **options: object
    ) -> None:
        if action == "status":
            self.status()
            return
        if not name:
            raise CommandError(f"upgrade {action} needs the change's name")
        try:
            if check:
                problems = change_preconditions(name, MOVES[action])
                for problem in problems:
                    self.stdout.write(f"  - {problem}")
                self.stdout.write(f"{name} -> {MOVES[action]}: {'refused' if problems else 'may go ahead'}")
                sys.exit(1 if problems else 0)
            change = change_move(name=name, to=MOVES[action], by=by or "manage.py upgrade", reason=reason)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"{change.name}: {change.phase} (by {change.changed_by}: {change.reason})")

    def status(self) -> None:
        for change in SchemaChange.objects.order_by("name"):
            backfill = Backfill.objects.filter(name=change.name).first()
            conflicts = StateConflict.objects.filter(change=change.name, status=ConflictStatus.OPEN).count()
            self.stdout.write(
                f"{change.name}: {change.phase} (v{change.from_version} -> v{change.to_version}), "
                f"{records_behind(change.name):,} records still at v{change.from_version}, {conflicts} open conflicts; "
                f"backfill {backfill.state if backfill else 'never run'}"
                f"{f' ({backfill.changed:,} moved)' if backfill else ''}; since {change.changed_at:%Y-%m-%d %H:%M} UTC "
                f"by {change.changed_by}"
            )
        builds = fleet_builds()
        self.stdout.write(f"workers ({sum(b.live for b in builds)} live of {len(builds)} registered):")
        for build in builds:
            self.stdout.write(f"  {'live ' if build.live else 'idle '} {build.describe()}")
