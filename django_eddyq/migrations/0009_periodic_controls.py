"""Periodic schedules an operator steers: ``enabled``, and the job of the last enqueued run.

Both columns are added without rewriting the table: a constant default, and a nullable column.
``last_job_id`` is no foreign key, as the cleaner deletes jobs.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0008_worker_registry"),
    ]

    operations = [
        migrations.AddField(
            model_name="periodicschedule",
            name="enabled",
            field=models.BooleanField(db_default=True, default=True, verbose_name="enabled"),
        ),
        migrations.AddField(
            model_name="periodicschedule",
            name="last_job_id",
            field=models.BigIntegerField(blank=True, null=True, verbose_name="last run's job"),
        ),
    ]
