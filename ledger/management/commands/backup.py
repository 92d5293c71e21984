"""`manage.py backup --output FILE`: write the backup manifest into the database, then dump
it with pg_dump (custom format), so the manifest is inside the backup; the manifest is also
written beside it as FILE.manifest.json. `--manifest-only` records and prints the manifest
(for a backup taken by other means right after, e.g. a volume snapshot)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from ledger.services.upgrades.restore import backup_manifest_record


class Command(BaseCommand):
    help = "Record the backup manifest in the database and dump it (PostgreSQL: pg_dump)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--output", help="the dump file (pg_dump custom format)")
        parser.add_argument("--label", default="", help="a name for this backup")
        parser.add_argument("--by", default="manage.py backup")
        parser.add_argument("--manifest-only", action="store_true")

    def handle(
        self, *args: object, output: str | None, label: str, by: str, manifest_only: bool, **options: object
    ) -> None:
        if not manifest_only and not output:
            raise CommandError("give --output FILE (or --manifest-only)")
        manifest = backup_manifest_record(by=by, label=label)
        document = {"taken_at": manifest.taken_at.isoformat(), "label": label, **manifest.manifest}
        if manifest_only:
            self.stdout.write(json.dumps(document, indent=2, sort_keys=True))
            return
        pg_dump = shutil.which("pg_dump", path=settings.FENCELINE["PG_BIN_DIR"])
        if pg_dump is None:
            raise CommandError("pg_dump is not installed here")
        db = connection.get_connection_params()  # the embedded server's socket too
        env = {"PGPASSWORD": db.get("password") or ""}
        command = [pg_dump, "--format=custom", "--file", output, "--dbname", db["dbname"]]
        for flag, value in (("--host", db.get("host")), ("--port", db.get("port")), ("--username", db.get("user"))):
            if value:
                command += [flag, str(value)]
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)  # noqa: S603
        if done.returncode != 0:
            raise CommandError(f"pg_dump failed: {done.stderr.strip()[:500]}")
        Path(f"{output}.manifest.json").write_text(json.dumps(document, indent=2, sort_keys=True))
        self.stdout.write(f"backup {output} (manifest inside it and in {output}.manifest.json)")
