import django.db.models.functions.datetime
import django.db.models.manager
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="PeriodicSchedule",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=200, primary_key=True, serialize=False, verbose_name="schedule"
                    ),
                ),
                ("last_run_at", models.DateTimeField(verbose_name="last run at")),
                (
                    "updated_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="updated at",
                    ),
                ),
            ],
            options={
                "verbose_name": "periodic schedule",
                "verbose_name_plural": "periodic schedules",
                "db_table": "eddyq_periodic",
            },
        ),
        migrations.AlterModelOptions(
            name="job",
            options={
                "base_manager_name": "all_objects",
                "default_manager_name": "objects",
                "ordering": ["-id"],
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
            },
        ),
        migrations.AlterModelManagers(
            name="job",
            managers=[
                ("all_objects", django.db.models.manager.Manager()),
                ("objects", django.db.models.manager.Manager()),
            ],
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("state"),
                models.F("finalized_at"),
                condition=models.Q(
                    ("retention__isnull", False),
                    ("state__in", ["completed", "failed", "cancelled"]),
                ),
                name="eddyq_jobs_retention_idx",
            ),
        ),
    ]
