"""Smoke test of the built wheel, installed (not editable) in a fresh environment: run from a
folder that is not the repository, so that only the installed package can be imported."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import django
from django.conf import settings

package = resources.files("django_eddyq")
assert "site-packages" in str(package), f"not the installed wheel: {package}"
for needed in (
    "py.typed",
    "templates/admin/django_eddyq/job/change_list.html",
    "static/django_eddyq/admin.css",
    "migrations/0001_initial.py",
):
    assert package.joinpath(needed).is_file(), f"the wheel lacks django_eddyq/{needed}"

settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django_eddyq",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}},
    USE_TZ=True,
)
django.setup()

from django.db.migrations.loader import MigrationLoader  # noqa: E402

from django_eddyq import task  # noqa: E402
from django_eddyq.models import Job  # noqa: E402

migrations = MigrationLoader(None, ignore_no_migrations=True).disk_migrations
names = sorted(name for app, name in migrations if app == "django_eddyq")
assert names and names[0] == "0001_initial", names
assert Job._meta.db_table == "eddyq_jobs"


@task
def smoke(x: int) -> int:
    return x


assert smoke(2) == 2
print(f"wheel smoke test passed: {len(names)} migrations, python {sys.version.split()[0]}")
print(Path(str(package)))
