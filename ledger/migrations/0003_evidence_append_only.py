"""The evidence tables (events, checkpoints) refuse UPDATE and DELETE at the database level:
a row trigger raises for any UPDATE or DELETE on them (TRUNCATE, which only the table owner
may run, is left to operators and the test runner).
"""

from django.db import migrations

TABLES = ("ledger_event", "ledger_checkpoint")

FUNCTION = """
CREATE OR REPLACE FUNCTION fenceline_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

TRIGGERS = [
    f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
    "FOR EACH ROW EXECUTE FUNCTION fenceline_append_only()"
    for table in TABLES
]
DROP_TRIGGERS = [f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}" for table in TABLES]


class Migration(migrations.Migration):
    dependencies = [("ledger", "0002_indicators_checkpoints")]
    operations = [migrations.RunSQL([FUNCTION, *TRIGGERS], DROP_TRIGGERS)]
