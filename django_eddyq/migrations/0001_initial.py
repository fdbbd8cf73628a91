import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Leader",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=64, primary_key=True, serialize=False, verbose_name="election"
                    ),
                ),
                ("leader_id", models.CharField(max_length=255, verbose_name="leader")),
                (
                    "elected_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="elected at",
                    ),
                ),
                ("expires_at", models.DateTimeField(verbose_name="expires at")),
            ],
            options={
                "verbose_name": "leader",
                "verbose_name_plural": "leaders",
                "db_table": "eddyq_leader",
            },
        ),
        migrations.CreateModel(
            name="Queue",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=64, primary_key=True, serialize=False, verbose_name="name"
                    ),
                ),
                (
                    "paused_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="paused at"),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="created at",
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="updated at",
                    ),
                ),
                ("metadata", models.JSONField(default=dict, verbose_name="metadata")),
            ],
            options={
                "verbose_name": "queue",
                "verbose_name_plural": "queues",
                "db_table": "eddyq_queues",
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="Batch",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "state",
                    models.CharField(
                        choices=[("pending", "pending"), ("complete", "complete")],
                        default="pending",
                        max_length=16,
                        verbose_name="state",
                    ),
                ),
                (
                    "sealed",
                    models.BooleanField(
                        default=False,
                        help_text="No more jobs can join once sealed.",
                        verbose_name="sealed",
                    ),
                ),
                (
                    "callback_task",
                    models.CharField(blank=True, max_length=255, verbose_name="callback task"),
                ),
                (
                    "callback_args",
                    models.JSONField(default=list, verbose_name="callback arguments"),
                ),
                (
                    "callback_kwargs",
                    models.JSONField(default=dict, verbose_name="callback keyword arguments"),
                ),
                (
                    "callback_job",
                    models.BigIntegerField(blank=True, null=True, verbose_name="callback job id"),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="created at",
                    ),
                ),
                (
                    "finalized_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="finalized at"),
                ),
                ("metadata", models.JSONField(default=dict, verbose_name="metadata")),
            ],
            options={
                "verbose_name": "batch",
                "verbose_name_plural": "batches",
                "db_table": "eddyq_batches",
                "ordering": ["-id"],
                "indexes": [
                    models.Index(
                        models.F("finalized_at"),
                        condition=models.Q(("state", "complete")),
                        name="eddyq_batches_finalized_idx",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "task",
                    models.CharField(
                        help_text="module.qualname", max_length=255, verbose_name="task"
                    ),
                ),
                ("args", models.JSONField(default=list, verbose_name="positional arguments")),
                ("kwargs", models.JSONField(default=dict, verbose_name="keyword arguments")),
                ("queue", models.CharField(default="default", max_length=64, verbose_name="queue")),
                (
                    "priority",
                    models.SmallIntegerField(
                        default=0,
                        help_text="From -100 to 100; higher runs first.",
                        verbose_name="priority",
                    ),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("scheduled", "scheduled"),
                            ("available", "available"),
                            ("running", "running"),
                            ("retryable", "retryable"),
                            ("completed", "completed"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                        ],
                        default="available",
                        max_length=16,
                        verbose_name="state",
                    ),
                ),
                ("attempt", models.PositiveIntegerField(default=0, verbose_name="attempt")),
                (
                    "max_attempts",
                    models.PositiveIntegerField(default=25, verbose_name="max attempts"),
                ),
                (
                    "run_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(), verbose_name="run at"
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="created at",
                    ),
                ),
                (
                    "attempted_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="attempted at"),
                ),
                (
                    "finalized_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="finalized at"),
                ),
                (
                    "locked_by",
                    models.CharField(
                        blank=True, max_length=255, null=True, verbose_name="locked by"
                    ),
                ),
                (
                    "locked_until",
                    models.DateTimeField(blank=True, null=True, verbose_name="locked until"),
                ),
                (
                    "heartbeat_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="heartbeat at"),
                ),
                ("errors", models.JSONField(default=list, verbose_name="errors")),
                ("result", models.JSONField(blank=True, null=True, verbose_name="result")),
                (
                    "retention",
                    models.JSONField(
                        blank=True,
                        help_text="Seconds to keep this job per terminal state; null keeps it forever.",
                        null=True,
                        verbose_name="retention override",
                    ),
                ),
                ("metadata", models.JSONField(default=dict, verbose_name="metadata")),
                (
                    "batch",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="jobs",
                        to="django_eddyq.batch",
                        verbose_name="batch",
                    ),
                ),
            ],
            options={
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
                "db_table": "eddyq_jobs",
                "ordering": ["-id"],
                "indexes": [
                    models.Index(
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("run_at"),
                        models.F("id"),
                        condition=models.Q(("state", "available")),
                        name="eddyq_jobs_claim_idx",
                    ),
                    models.Index(
                        models.F("queue"),
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("run_at"),
                        models.F("id"),
                        condition=models.Q(("state", "available")),
                        name="eddyq_jobs_queue_claim_idx",
                    ),
                    models.Index(
                        models.F("run_at"),
                        condition=models.Q(("state__in", ["scheduled", "retryable"])),
                        name="eddyq_jobs_due_idx",
                    ),
                    models.Index(
                        models.F("locked_until"),
                        condition=models.Q(("state", "running")),
                        name="eddyq_jobs_lease_idx",
                    ),
                    models.Index(
                        models.F("state"),
                        models.F("finalized_at"),
                        condition=models.Q(("state__in", ["completed", "failed", "cancelled"])),
                        name="eddyq_jobs_finalized_idx",
                    ),
                    models.Index(
                        models.F("batch"),
                        condition=models.Q(("batch__isnull", False)),
                        name="eddyq_jobs_batch_idx",
                    ),
                    models.Index(models.F("task"), models.F("state"), name="eddyq_jobs_task_idx"),
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("priority__gte", -100), ("priority__lte", 100)),
                        name="eddyq_jobs_priority_range",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "state__in",
                                [
                                    "scheduled",
                                    "available",
                                    "running",
                                    "retryable",
                                    "completed",
                                    "failed",
                                    "cancelled",
                                ],
                            )
                        ),
                        name="eddyq_jobs_state_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("max_attempts__gte", 1)), name="eddyq_jobs_max_attempts"
                    ),
                ],
            },
        ),
        # Maintenance deletes batches in SQL, so the database itself must unlink their jobs.
        migrations.RunSQL(
            sql="""
                ALTER TABLE eddyq_jobs ADD CONSTRAINT eddyq_jobs_batch_fk
                FOREIGN KEY (batch_id) REFERENCES eddyq_batches (id) ON DELETE SET NULL
            """,
            reverse_sql="ALTER TABLE eddyq_jobs DROP CONSTRAINT eddyq_jobs_batch_fk",
        ),
    ]
