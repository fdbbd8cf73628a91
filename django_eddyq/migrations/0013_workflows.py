"""Workflows: their runs, steps and dependencies, and the jobs' state 'pending' (a step waiting for
the steps it depends on)."""

import django.db.models.deletion
from django.db import migrations, models

import django_eddyq.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0012_limit_keys"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkflowEdge",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "upstream_id",
                        "downstream_id",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("upstream_id", models.BigIntegerField(verbose_name="upstream job")),
                ("downstream_id", models.BigIntegerField(verbose_name="downstream job")),
                (
                    "ignore_failure",
                    models.BooleanField(default=False, verbose_name="ignore failure"),
                ),
            ],
            options={
                "verbose_name": "workflow dependency",
                "verbose_name_plural": "workflow dependencies",
                "db_table": "eddyq_workflow_edges",
            },
        ),
        migrations.CreateModel(
            name="WorkflowRun",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=200, verbose_name="name")),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("running", "running"),
                            ("completed", "completed"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                        ],
                        default="running",
                        max_length=16,
                        verbose_name="state",
                    ),
                ),
                (
                    "retention",
                    models.FloatField(
                        blank=True,
                        help_text="How long its jobs are kept once every step has ended; null: forever.",
                        null=True,
                        verbose_name="retention in seconds",
                    ),
                ),
                ("steps", models.PositiveIntegerField(default=0, verbose_name="steps")),
                (
                    "unfinished",
                    models.PositiveIntegerField(default=0, verbose_name="unfinished steps"),
                ),
                (
                    "failed",
                    models.PositiveIntegerField(
                        default=0, verbose_name="failed or cancelled steps"
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django_eddyq.models.TransactionNow(), verbose_name="created at"
                    ),
                ),
                (
                    "finalized_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="finalized at"),
                ),
            ],
            options={
                "verbose_name": "workflow",
                "verbose_name_plural": "workflows",
                "db_table": "eddyq_workflows",
                "ordering": ["-id"],
            },
        ),
        migrations.CreateModel(
            name="WorkflowStep",
            fields=[
                (
                    "job_id",
                    models.BigIntegerField(primary_key=True, serialize=False, verbose_name="job"),
                ),
                ("name", models.CharField(max_length=200, verbose_name="name")),
                (
                    "waiting_on",
                    models.PositiveIntegerField(default=0, verbose_name="dependencies not yet met"),
                ),
                (
                    "ended_state",
                    models.CharField(blank=True, max_length=16, null=True, verbose_name="ended"),
                ),
                (
                    "cancelled_by",
                    models.BigIntegerField(
                        blank=True, null=True, verbose_name="cancelled because of job"
                    ),
                ),
            ],
            options={
                "verbose_name": "workflow step",
                "verbose_name_plural": "workflow steps",
                "db_table": "eddyq_workflow_steps",
            },
        ),
        # The state check gains 'pending'. Added NOT VALID, then validated: the validation
        # reads the table without blocking its writes, where a plain ADD CONSTRAINT would hold
        # every enqueue and claim for the whole read.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="job",
                    name="eddyq_jobs_state_valid",
                ),
                migrations.AlterField(
                    model_name="job",
                    name="state",
                    field=models.CharField(
                        choices=[
                            ("pending", "pending"),
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
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "state__in",
                                [
                                    "pending",
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
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql=[
                        "ALTER TABLE eddyq_jobs DROP CONSTRAINT eddyq_jobs_state_valid",
                        "ALTER TABLE eddyq_jobs ADD CONSTRAINT eddyq_jobs_state_valid CHECK (state IN"
                        " ('pending', 'scheduled', 'available', 'running', 'retryable', 'completed',"
                        " 'failed', 'cancelled')) NOT VALID",
                        "ALTER TABLE eddyq_jobs VALIDATE CONSTRAINT eddyq_jobs_state_valid",
                    ],
                    reverse_sql=[
                        "ALTER TABLE eddyq_jobs DROP CONSTRAINT eddyq_jobs_state_valid",
                        "ALTER TABLE eddyq_jobs ADD CONSTRAINT eddyq_jobs_state_valid CHECK (state IN"
                        " ('scheduled', 'available', 'running', 'retryable', 'completed', 'failed',"
                        " 'cancelled')) NOT VALID",
                        "ALTER TABLE eddyq_jobs VALIDATE CONSTRAINT eddyq_jobs_state_valid",
                    ],
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("id"),
                condition=models.Q(("state", "pending")),
                name="eddyq_jobs_pending_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowedge",
            index=models.Index(models.F("downstream_id"), name="eddyq_workflow_edges_down_idx"),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                models.F("finalized_at"),
                condition=models.Q(("finalized_at__isnull", False)),
                name="eddyq_workflows_final_idx",
            ),
        ),
        migrations.AddField(
            model_name="workflowstep",
            name="workflow",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="step_rows",
                to="django_eddyq.workflowrun",
                verbose_name="workflow",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowstep",
            index=models.Index(
                models.F("cancelled_by"),
                condition=models.Q(("cancelled_by__isnull", False)),
                name="eddyq_workflow_steps_cause_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="workflowstep",
            constraint=models.UniqueConstraint(
                models.F("workflow"), models.F("name"), name="eddyq_workflow_steps_name"
            ),
        ),
    ]
