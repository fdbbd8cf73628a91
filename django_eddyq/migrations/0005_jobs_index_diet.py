"""Fewer index entries per job: each claim and finish of a job is a new row version (its state,
named in the partial indexes' predicates, changes, so no update is HOT), which takes an entry in
every index whose predicate it meets.

* The index Django made for the batch foreign key held every row version of every job, NULL
  batches included; eddyq_jobs_batch_idx, of the jobs that have a batch, serves every lookup.
* The task index now holds only the jobs that stay a while (scheduled, retryable and ended
  ones), not those passing through (available, then running): two entries fewer per job.

Not atomic: the indexes are built and dropped CONCURRENTLY, so that enqueues and claims go on
meanwhile.
"""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_eddyq", "0004_jobs_autovacuum"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="batch",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="jobs",
                        to="django_eddyq.batch",
                        verbose_name="batch",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX CONCURRENTLY IF EXISTS eddyq_jobs_batch_id_5befd3d8",
                    reverse_sql="CREATE INDEX CONCURRENTLY IF NOT EXISTS "
                    "eddyq_jobs_batch_id_5befd3d8 ON eddyq_jobs (batch_id)",
                ),
            ],
        ),
        RemoveIndexConcurrently(model_name="job", name="eddyq_jobs_task_idx"),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("task"),
                models.F("state"),
                condition=~models.Q(state__in=["available", "running"]),
                name="eddyq_jobs_task_idx",
            ),
        ),
    ]
