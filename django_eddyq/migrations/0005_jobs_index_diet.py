"""Drop the index Django made for the batch foreign key.

It held an entry for every row version of every job, NULL batches included: each job's claim
and finish wrote to it (all updates of a job are non-HOT, since its state is in the partial
indexes' predicates). eddyq_jobs_batch_idx, which holds only the jobs that have a batch, serves
every lookup by batch.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0004_jobs_autovacuum"),
    ]

    operations = [
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
    ]
