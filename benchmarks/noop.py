"""Tasks the benchmarks enqueue; workers import them as ``benchmarks.noop.<name>``."""

import time

from django_eddyq import task


@task
def noop() -> None:
    """Does nothing: what is measured is the queue's own cost per job."""


@task
def pause(seconds: float) -> None:
    """Sleeps ``seconds``: a job that takes time and no CPU, as one waiting on a service does
    (flow control's rows, where how many run at once is what is measured)."""
    time.sleep(seconds)


@task(atomic=True)
def atomic_noop() -> None:
    """Does nothing, atomically: what is measured is the cost of a completion committed on its
    own, in the handler's transaction, against the batched completions of ``noop``."""


@task
def query() -> None:
    """Runs one query on Django's connection, as a handler that reads a row does: what the
    connection settings cost a worker's jobs (benchmarks/connections.py)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
