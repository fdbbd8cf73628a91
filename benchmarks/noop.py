"""Tasks the benchmarks enqueue; workers import them as ``benchmarks.noop.<name>``."""

from django_eddyq import task


@task
def noop() -> None:
    """Does nothing: what is measured is the queue's own cost per job."""
