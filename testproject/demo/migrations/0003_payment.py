from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("demo", "0002_execution_ordering"),
    ]

    operations = [
        migrations.CreateModel(
            name="Payment",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("order_id", models.BigIntegerField()),
                ("amount_cents", models.BigIntegerField()),
                ("job_id", models.BigIntegerField(null=True)),
            ],
        ),
    ]
