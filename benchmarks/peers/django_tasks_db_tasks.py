"""The django-tasks-db peer's tasks (Django's ``@task``; imported once Django is set up)."""

from django.tasks import task

from benchmarks.common import record_start


@task
def noop() -> None:
    """Does nothing."""


@task
def probe(key: int) -> None:
    record_start(key)
