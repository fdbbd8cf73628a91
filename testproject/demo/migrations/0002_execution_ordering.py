from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("demo", "0001_initial"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="execution",
            options={"ordering": ("id",)},
        ),
    ]
