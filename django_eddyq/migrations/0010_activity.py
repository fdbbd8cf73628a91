"""The activity counters (``eddyq_activity``): jobs finished per minute, queue and worker, and
each queue's sampled depth, for the admin's charts and ``eddyq status``.

Each worker updates its own row of the minute at each pass that finishes jobs: a fillfactor
below 100 leaves room in each page for those updates to stay HOT (no index entry per update;
no indexed column changes), and vacuum after a few hundred dead rows keeps the small table
small.
"""

from django.db import migrations, models

SETTINGS = "fillfactor = 70, autovacuum_vacuum_threshold = 500"


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0009_periodic_controls"),
    ]

    operations = [
        migrations.CreateModel(
            name="Activity",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "minute",
                        "queue",
                        "source",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("minute", models.DateTimeField(verbose_name="minute")),
                ("queue", models.CharField(max_length=64, verbose_name="queue")),
                ("source", models.CharField(max_length=255, verbose_name="source")),
                ("completed", models.BigIntegerField(db_default=0, verbose_name="completed")),
                ("failed", models.BigIntegerField(db_default=0, verbose_name="failed")),
                ("retried", models.BigIntegerField(db_default=0, verbose_name="retried")),
                ("cancelled", models.BigIntegerField(db_default=0, verbose_name="cancelled")),
                ("snoozed", models.BigIntegerField(db_default=0, verbose_name="snoozed")),
                (
                    "available",
                    models.BigIntegerField(blank=True, null=True, verbose_name="available jobs"),
                ),
            ],
            options={
                "verbose_name": "activity",
                "verbose_name_plural": "activity",
                "db_table": "eddyq_activity",
            },
        ),
        migrations.RunSQL(
            f"ALTER TABLE eddyq_activity SET ({SETTINGS})",
            reverse_sql="ALTER TABLE eddyq_activity RESET (fillfactor, autovacuum_vacuum_threshold)",
        ),
    ]
