"""Every event's MAC beside its hash (fenceline_client/evidence_verifier.py). Adds the two columns with a
database default of "": no row is rewritten (the events are append-only), and the events
written before carry no MAC; the verifier accepts those only under a checkpoint."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0014_operation_reconciler"),
    ]

    operations = [
        migrations.AddField(
            model_name="event",
            name="mac",
            field=models.CharField(blank=True, db_default="", default="", max_length=100),
        ),
        migrations.AddField(
            model_name="event",
            name="mac_key_id",
            field=models.CharField(blank=True, db_default="", default="", max_length=64),
        ),
    ]
