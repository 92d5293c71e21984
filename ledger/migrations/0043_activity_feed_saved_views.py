# The activity feed (ledger/activity.py) reads every tenant's events newest first from
# event_recent, one type's from event_type_recent, and the few events people and jobs wrote (not workers) by actor from the
# partial event_not_by_workers; both are built CONCURRENTLY, as appends go on meanwhile.
# Saved views: a console user's names for a list's query string (ledger/models/preferences.py).

import django.db.models.deletion
from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.models import Q


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("ledger", "0042_levers_reporting"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="SavedView",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("schema_version", models.PositiveSmallIntegerField(default=1)),
                ("list_name", models.CharField(max_length=40)),
                ("name", models.CharField(max_length=80)),
                ("querystring", models.CharField(blank=True, max_length=1000)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="saved_views",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"ordering": ["list_name", "name"]},
        ),
        migrations.AddConstraint(
            model_name="savedview",
            constraint=models.UniqueConstraint(fields=("user", "list_name", "name"), name="savedview_unique_name"),
        ),
        AddIndexConcurrently("event", models.Index(fields=["occurred_at", "id"], name="event_recent")),
        AddIndexConcurrently("event", models.Index(fields=["type", "occurred_at", "id"], name="event_type_recent")),
        AddIndexConcurrently(
            "event",
            models.Index(
                fields=["actor", "occurred_at", "id"],
                condition=~Q(actor__startswith="worker:"),
                name="event_not_by_workers",
            ),
        ),
    ]
