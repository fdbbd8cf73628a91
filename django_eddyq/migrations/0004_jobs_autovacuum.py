"""Autovacuum settings for the job table, which churns far more than a typical table.

Each job leaves two or three dead row versions behind (its claim, its finish, each heartbeat),
while completed jobs kept for RETENTION make the live row count large. With the server's
defaults (a vacuum once 20% of the live rows are dead), a table holding a day of history
piles up hundreds of thousands of dead rows between vacuums, and every claim walks past them.
These settings vacuum after 1% (plus 1,000 rows) instead, at a higher cost limit, and keep the
statistics the claim's plan depends on fresh.
"""

from django.db import migrations

SETTINGS = """
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 2000
"""
SETTING_NAMES = """
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_insert_scale_factor,
    autovacuum_analyze_scale_factor,
    autovacuum_vacuum_cost_limit
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_eddyq", "0003_cancellation_unique_jobs"),
    ]

    operations = [
        migrations.RunSQL(
            f"ALTER TABLE eddyq_jobs SET ({SETTINGS})",
            reverse_sql=f"ALTER TABLE eddyq_jobs RESET ({SETTING_NAMES})",
        ),
    ]
