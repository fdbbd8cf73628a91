"""Flow control: a queue's global concurrency and rate, and the rate limits' token buckets.

Nullable columns, added without rewriting the table; the checks hold what the claim trusts.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0010_activity"),
    ]

    operations = [
        migrations.CreateModel(
            name="RateBucket",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=200, primary_key=True, serialize=False, verbose_name="limit"
                    ),
                ),
                ("tokens", models.FloatField(verbose_name="tokens")),
                ("refilled_at", models.DateTimeField(verbose_name="counted at")),
            ],
            options={
                "verbose_name": "rate bucket",
                "verbose_name_plural": "rate buckets",
                "db_table": "eddyq_rate_buckets",
            },
        ),
        migrations.AddField(
            model_name="queue",
            name="concurrency",
            field=models.IntegerField(
                blank=True,
                help_text="At most this many of the queue's jobs run at once, on all workers.",
                null=True,
                verbose_name="concurrency",
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_burst",
            field=models.IntegerField(blank=True, null=True, verbose_name="rate: burst"),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_limit",
            field=models.IntegerField(blank=True, null=True, verbose_name="rate: jobs"),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_period",
            field=models.FloatField(blank=True, null=True, verbose_name="rate: period in seconds"),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("concurrency__isnull", True), ("concurrency__gte", 1), _connector="OR"
                ),
                name="eddyq_queues_concurrency_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("rate_burst__isnull", True),
                        ("rate_limit__isnull", True),
                        ("rate_period__isnull", True),
                    ),
                    models.Q(
                        ("rate_burst__gte", 1),
                        ("rate_burst__isnull", False),
                        ("rate_burst__lte", models.F("rate_limit")),
                        ("rate_limit__gte", 1),
                        ("rate_limit__isnull", False),
                        ("rate_period__gt", 0),
                        ("rate_period__isnull", False),
                        ("rate_period__lte", 3153600000),
                    ),
                    _connector="OR",
                ),
                name="eddyq_queues_rate_valid",
            ),
        ),
    ]
