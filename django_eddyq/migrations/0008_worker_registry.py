"""The registry of worker processes (``eddyq_workers``), and the worker of each job's latest
attempt (``eddyq_jobs.attempted_by``). A nullable column without a default: adding it rewrites
no row, however many jobs there are.
"""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0007_job_payload_permission"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkerProcess",
            fields=[
                (
                    "id",
                    models.CharField(
                        max_length=255, primary_key=True, serialize=False, verbose_name="worker id"
                    ),
                ),
                ("host", models.CharField(max_length=255, verbose_name="host")),
                ("pid", models.IntegerField(verbose_name="pid")),
                ("version", models.CharField(max_length=64, verbose_name="version")),
                (
                    "queues",
                    models.JSONField(
                        blank=True, help_text="null: all", null=True, verbose_name="queues"
                    ),
                ),
                ("concurrency", models.PositiveIntegerField(verbose_name="concurrency")),
                (
                    "started_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="started at",
                    ),
                ),
                (
                    "last_seen_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="last seen at",
                    ),
                ),
                ("running", models.PositiveIntegerField(default=0, verbose_name="jobs running")),
                ("leader", models.BooleanField(default=False, verbose_name="leader")),
                (
                    "stopped_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="stopped at"),
                ),
            ],
            options={
                "verbose_name": "worker",
                "verbose_name_plural": "workers",
                "db_table": "eddyq_workers",
                "ordering": ["-started_at"],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="attempted_by",
            field=models.CharField(
                blank=True, max_length=255, null=True, verbose_name="attempted by"
            ),
        ),
    ]
