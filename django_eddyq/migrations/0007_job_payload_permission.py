"""The permission to see jobs' arguments, results and tracebacks in the admin, which the view
permission alone no longer shows. Django creates it after migrating; no table changes.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0006_job_times_default_to_transaction"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={
                "base_manager_name": "all_objects",
                "default_manager_name": "objects",
                "ordering": ["-id"],
                "permissions": (
                    ("view_job_payload", "Can view job arguments, results and tracebacks"),
                ),
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
            },
        ),
    ]
