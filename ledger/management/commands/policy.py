"""Policy as code: ``policy export`` writes a tenant's current policy as a file, ``policy
apply`` makes a file the tenant's policy through the same service the console uses
(ledger.services.authority.policy), after printing what changes."""

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.api.body import parse_json_object
from ledger.errors import DomainError
from ledger.management.commands.create_credential import tenant_by_slug
from ledger.models import Tenant
from ledger.services.authority.policy import policy_apply, policy_export, policy_from_file


class Command(BaseCommand):
    help = (
        "Policy as code. 'export' writes the tenant's current policy (pretty JSON, sorted keys, with its "
        "version); 'apply' prints what a file changes and makes it the tenant's policy as a new version "
        "(nothing is written when nothing changes, or with --dry-run)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        export = actions.add_parser("export", help="write the current policy as JSON")
        export.add_argument("--tenant", required=True, help="tenant slug")
        export.add_argument("--out", type=Path, help="write to this file (default: standard output)")
        apply = actions.add_parser("apply", help="make a policy file the tenant's policy")
        apply.add_argument("file", type=Path, help="a file from 'policy export', or a bare policy document")
        apply.add_argument("--tenant", required=True, help="tenant slug")
        apply.add_argument("--by", required=True, help="username of the person changing the policy")
        apply.add_argument("--reason", required=True, help="why (recorded with the new version)")
        apply.add_argument("--dry-run", action="store_true", help="only print what would change")

    def handle(self, *args: object, action: str, **options: Any) -> None:
        # ``options``: the arguments of the one subcommand given (argparse's values).
        tenant = tenant_by_slug(options["tenant"])
        if action == "export":
            self._export(tenant, options["out"])
        else:
            self._apply(tenant, options["file"], by=options["by"], reason=options["reason"], dry_run=options["dry_run"])

    def _export(self, tenant: Tenant, out: Path | None) -> None:
        text = json.dumps(policy_export(tenant=tenant), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        if out is None:
            self.stdout.write(text, ending="")
            return
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"{out}: {exc.strerror}") from None
        self.stdout.write(f"wrote policy version {json.loads(text)['version']} of {tenant.slug} to {out}")

    def _apply(self, tenant: Tenant, path: Path, *, by: str, reason: str, dry_run: bool) -> None:
        try:
            text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommandError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        try:
            document = policy_from_file(parse_json_object(text))
            result = policy_apply(
                tenant=tenant,
                document=document,
                reason=reason,
                changed_by=by,
                dry_run=dry_run,
            )
        except DomainError as exc:
            raise CommandError(f"{path}: {exc.detail}") from None
        if not result.diff:
            self.stdout.write(f"nothing changes: {path} is policy version {result.version} of {tenant.slug}")
            return
        for line in result.diff:
            self.stdout.write(line)
        if result.created:
            self.stdout.write(f"policy version {result.version} is now current for {tenant.slug}")
        else:
            self.stdout.write(f"dry run: {len(result.diff)} change(s) not written (current: version {result.version})")
