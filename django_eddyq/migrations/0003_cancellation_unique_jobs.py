from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0002_maintenance"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="cancel_requested_at",
            field=models.DateTimeField(
                blank=True,
                help_text="Set when a running job is cancelled: its worker stops it as it can.",
                null=True,
                verbose_name="cancel requested at",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.TextField(
                blank=True,
                help_text="While set, no other job with this key can be enqueued.",
                null=True,
                verbose_name="unique key",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                models.F("unique_key"),
                condition=models.Q(("unique_key__isnull", False)),
                name="eddyq_jobs_unique_key",
            ),
        ),
    ]
