# Issue 16: indexes that only repeat the first column of another index of their table go from
# the tables the fenced path writes. Each was one more entry for every row written: in
# authority mode a dispatch writes a cost reservation and five links to its windows and
# shards. Their lookups (and the foreign keys' checks) use the wider index:
#   ledger_costreservation (operation_id)            -> reservation_one_per_attempt (operation_id, attempt)
#   ledger_costreservation_windows (costreservation_id) -> its unique (costreservation_id, costwindow_id)
#   ledger_costreservation_shards (costreservation_id)  -> its unique (costreservation_id, costshard_id)
#   ledger_run (tenant_id)                            -> run_tenant_recent (tenant_id, created_at DESC)
#   ledger_credentiallease (tenant_id)                -> credlease_active (tenant_id, ...)
#   ledger_capabilitybudget (run_id)                  -> capability_run_tool (run_id, tool)
# The link tables are Django's own (no model to say db_index=False on), so their index is
# found by introspection and dropped; going back creates it again.

import django.db.models.deletion
from django.db import migrations, models

LINKS = (("windows", "costreservation_id"), ("shards", "costreservation_id"))


def _link_tables(apps):
    reservation = apps.get_model("ledger", "CostReservation")
    for field, column in LINKS:
        yield reservation._meta.get_field(field).remote_field.through._meta.db_table, column


def _single_column_indexes(schema_editor, table: str, column: str) -> list[str]:
    with schema_editor.connection.cursor() as cursor:
        constraints = schema_editor.connection.introspection.get_constraints(cursor, table)
    return [
        name
        for name, info in constraints.items()
        if info["index"] and not info["unique"] and not info["primary_key"] and info["columns"] == [column]
    ]


def drop_link_indexes(apps, schema_editor):
    for table, column in _link_tables(apps):
        for name in _single_column_indexes(schema_editor, table, column):
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}")


def create_link_indexes(apps, schema_editor):
    for table, column in _link_tables(apps):
        if not _single_column_indexes(schema_editor, table, column):
            name = schema_editor._create_index_name(table, [column])
            quoted = schema_editor.quote_name
            schema_editor.execute(f"CREATE INDEX {quoted(name)} ON {quoted(table)} ({quoted(column)})")


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY on PostgreSQL

    dependencies = [
        ("ledger", "0029_run_flag_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="costreservation",
            name="operation",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="cost_reservations",
                to="ledger.operation",
            ),
        ),
        migrations.AlterField(
            model_name="run",
            name="tenant",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="runs", to="ledger.tenant"
            ),
        ),
        migrations.AlterField(
            model_name="credentiallease",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="credential_leases",
                to="ledger.tenant",
            ),
        ),
        migrations.AlterField(
            model_name="capabilitybudget",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="capabilities",
                to="ledger.run",
            ),
        ),
        migrations.RunPython(drop_link_indexes, create_link_indexes),
    ]
