"""Schema operations the migrations share."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations


class AddIndexWhereConcurrent(AddIndexConcurrently):
    """``CREATE INDEX CONCURRENTLY`` on PostgreSQL (writes to the table go on while it is
    built; the migration must be ``atomic = False``), a plain ``CREATE INDEX`` on the
    embedded SQLite."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)
