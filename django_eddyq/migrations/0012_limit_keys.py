"""Flow control per key: a job's limit key, the keyed claim's indexes, the claim indexes left to
the jobs without a key, and rate buckets named by task and key.

Not atomic: the claim indexes are rebuilt CONCURRENTLY under a new name, the old ones dropped
CONCURRENTLY and the new ones renamed to the old names, so that enqueues and claims go on
meanwhile and settings that name the indexes (REINDEX_INDEXES) still hold. The column is
nullable, added without rewriting the table; no existing job has a key.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_eddyq", "0011_queue_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="limit_key",
            field=models.TextField(
                blank=True,
                help_text=(
                    "The key its task's limits count it under; empty when the task is limited "
                    "as a whole."
                ),
                null=True,
                verbose_name="limit key",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="job", name="eddyq_jobs_claim_idx"),
                migrations.RemoveIndex(model_name="job", name="eddyq_jobs_queue_claim_idx"),
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(
                        models.F("priority").desc(),
                        "run_at",
                        "id",
                        condition=models.Q(state="available", limit_key__isnull=True),
                        name="eddyq_jobs_claim_idx",
                    ),
                ),
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(
                        "queue",
                        models.F("priority").desc(),
                        "run_at",
                        "id",
                        condition=models.Q(state="available", limit_key__isnull=True),
                        name="eddyq_jobs_queue_claim_idx",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX CONCURRENTLY IF EXISTS eddyq_jobs_claim_idx_rebuilt",
                    reverse_sql=migrations.RunSQL.noop,
                ),
                migrations.RunSQL(
                    "CREATE INDEX CONCURRENTLY eddyq_jobs_claim_idx_rebuilt "
                    "ON eddyq_jobs (priority DESC, run_at, id) "
                    "WHERE state = 'available' AND limit_key IS NULL",
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS eddyq_jobs_claim_idx_rebuilt",
                ),
                migrations.RunSQL(
                    "DROP INDEX CONCURRENTLY eddyq_jobs_claim_idx",
                    reverse_sql="CREATE INDEX CONCURRENTLY eddyq_jobs_claim_idx "
                    "ON eddyq_jobs (priority DESC, run_at, id) WHERE state = 'available'",
                ),
                migrations.RunSQL(
                    "ALTER INDEX eddyq_jobs_claim_idx_rebuilt RENAME TO eddyq_jobs_claim_idx",
                    reverse_sql="ALTER INDEX eddyq_jobs_claim_idx RENAME TO eddyq_jobs_claim_idx_rebuilt",
                ),
                migrations.RunSQL(
                    "DROP INDEX CONCURRENTLY IF EXISTS eddyq_jobs_queue_claim_idx_rebuilt",
                    reverse_sql=migrations.RunSQL.noop,
                ),
                migrations.RunSQL(
                    "CREATE INDEX CONCURRENTLY eddyq_jobs_queue_claim_idx_rebuilt "
                    "ON eddyq_jobs (queue, priority DESC, run_at, id) "
                    "WHERE state = 'available' AND limit_key IS NULL",
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS eddyq_jobs_queue_claim_idx_rebuilt",
                ),
                migrations.RunSQL(
                    "DROP INDEX CONCURRENTLY eddyq_jobs_queue_claim_idx",
                    reverse_sql="CREATE INDEX CONCURRENTLY eddyq_jobs_queue_claim_idx "
                    "ON eddyq_jobs (queue, priority DESC, run_at, id) WHERE state = 'available'",
                ),
                migrations.RunSQL(
                    "ALTER INDEX eddyq_jobs_queue_claim_idx_rebuilt RENAME TO eddyq_jobs_queue_claim_idx",
                    reverse_sql="ALTER INDEX eddyq_jobs_queue_claim_idx RENAME TO eddyq_jobs_queue_claim_idx_rebuilt",
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("priority").desc(),
                "run_at",
                "id",
                condition=models.Q(state="available", limit_key__isnull=False),
                name="eddyq_jobs_keyed_order_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                "queue",
                "task",
                "limit_key",
                models.F("priority").desc(),
                "run_at",
                "id",
                condition=models.Q(state="available", limit_key__isnull=False),
                name="eddyq_jobs_keyed_claim_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                "task",
                "limit_key",
                condition=models.Q(state="running", limit_key__isnull=False),
                name="eddyq_jobs_keyed_running_idx",
            ),
        ),
        migrations.AlterField(
            model_name="ratebucket",
            name="name",
            field=models.TextField(primary_key=True, serialize=False, verbose_name="limit"),
        ),
        migrations.AddField(
            model_name="ratebucket",
            name="full_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="full at"),
        ),
    ]
