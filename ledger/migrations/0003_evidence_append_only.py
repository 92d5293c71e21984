"""The evidence tables (events, checkpoints) refuse UPDATE and DELETE at the database level.

PostgreSQL: a row trigger raises for any UPDATE or DELETE on ledger_event (TRUNCATE, which
only the table owner may run, is left to operators and the test runner). SQLite: BEFORE
UPDATE / BEFORE DELETE triggers abort.
"""

from django.db import migrations

TABLES = ("ledger_event", "ledger_checkpoint")

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION fenceline_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(PG_FUNCTION)
            for table in TABLES:
                cursor.execute(
                    f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                    "FOR EACH ROW EXECUTE FUNCTION fenceline_append_only()"
                )
        elif connection.vendor == "sqlite":
            for table in TABLES:
                for op in ("UPDATE", "DELETE"):
                    cursor.execute(
                        f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table} "
                        f"BEGIN SELECT RAISE(ABORT, 'table {table} is append-only: {op} refused'); END"
                    )


def backwards(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        for table in TABLES:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            elif connection.vendor == "sqlite":
                for op in ("update", "delete"):
                    cursor.execute(f"DROP TRIGGER IF EXISTS {table}_no_{op}")


class Migration(migrations.Migration):
    dependencies = [("ledger", "0002_indicators_checkpoints")]
    operations = [migrations.RunPython(forwards, backwards)]
