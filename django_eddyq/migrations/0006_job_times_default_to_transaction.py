"""A job's created_at and run_at default to the transaction's start (now()), not the
statement's: enqueue_many's COPY leaves them to the default (PostgreSQL then parses two
timestamps fewer per row) and returns the now() it read earlier in the same transaction.

Only the columns' defaults change: no row is rewritten.
"""

from django.db import migrations, models

import django_eddyq.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0005_jobs_index_diet"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="created_at",
            field=models.DateTimeField(
                db_default=django_eddyq.models.TransactionNow(), verbose_name="created at"
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="run_at",
            field=models.DateTimeField(
                db_default=django_eddyq.models.TransactionNow(), verbose_name="run at"
            ),
        ),
    ]
