# The fence's home (ledger.sql.fence.fence_at_home): the database the fence row was last
# written in. The database migrated here becomes the home; a dump of it restored elsewhere
# (or over it with --clean) is refused fenced calls until restore_check moves the fence.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0035_fence_generation'),
    ]

    operations = [
        migrations.AddField(
            model_name='fencegeneration',
            name='home',
            field=models.CharField(blank=True, default='', max_length=80),
        ),
        migrations.RunSQL(
            "UPDATE ledger_fencegeneration SET home ="
            " (SELECT system_identifier FROM pg_control_system())::text"
            " || ':' || (SELECT oid FROM pg_database WHERE datname = current_database())::text"
            " || ':' || 'ledger_fencegeneration'::regclass::oid::text",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
