"""The benchmarks' task limited per key, apart from the others: a worker that declares such a
task sends the keyed claim too, at its first claim and after each notification of the task's
queue, so only flow control's keyed row has its workers import this module."""

import time

from django_eddyq import task


@task(concurrency=1, key=lambda seconds, customer: customer)
def pause_per_customer(seconds: float, customer: int) -> None:
    """``pause``, at most one running per customer on all workers (flow control's keyed row)."""
    time.sleep(seconds)
