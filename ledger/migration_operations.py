"""Schema operations the migrations share."""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations


class _ConcurrentOnPostgreSQL(migrations.operations.base.Operation):
    """The CONCURRENTLY form of an index operation on PostgreSQL (writes to the table go on
    while it runs; the migration must be ``atomic = False``), the ``plain`` form on the
    embedded SQLite."""

    plain: type[migrations.AddIndex] | type[migrations.RemoveIndex]

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            self.plain.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            self.plain.database_backwards(self, app_label, schema_editor, from_state, to_state)


class AddIndexWhereConcurrent(_ConcurrentOnPostgreSQL, AddIndexConcurrently):
    """``CREATE INDEX CONCURRENTLY`` on PostgreSQL, a plain ``CREATE INDEX`` on SQLite."""

    plain = migrations.AddIndex


class RemoveIndexWhereConcurrent(_ConcurrentOnPostgreSQL, RemoveIndexConcurrently):
    """``DROP INDEX CONCURRENTLY`` on PostgreSQL (no lock that stops the table's writers while
    it waits), a plain ``DROP INDEX`` on SQLite."""

    plain = migrations.RemoveIndex


def set_fillfactor(table: str, percent: int) -> migrations.RunPython:
    """Leave ``100 - percent`` of each new heap page of ``table`` free on PostgreSQL, so that an
    update of a row finds room on its own page and can be HOT (no new index entries); nothing
    on SQLite. Pages already written keep their layout until they are rewritten."""

    def forwards(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET (fillfactor = {int(percent)})")

    def backwards(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} RESET (fillfactor)")

    return migrations.RunPython(forwards, backwards, elidable=False)
