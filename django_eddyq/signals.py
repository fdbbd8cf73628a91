"""Django signals of the queue: what a job and a worker go through, for your receivers.

Connect receivers as to any Django signal::

    from django.dispatch import receiver
    from django_eddyq.signals import job_finished

    @receiver(job_finished)
    def count(sender, job, outcome, duration, exception, worker_id, **kwargs): ...

Every signal is sent with ``send_robust``: a receiver that raises is logged (ERROR, with its
traceback) and changes nothing else, no job's outcome included. With no receiver connected, a
signal costs one attribute read. Jobs of ``django.tasks`` tasks send them too, beside Django's
own ``task_enqueued``, ``task_started`` and ``task_finished``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

#: Jobs were inserted by one call (``enqueue``, ``enqueue_many``, a batch callback, a periodic
#: run, a Django task). ``sender``: the ``Job`` model; ``jobs``: the new ``Job`` instances (a job
#: that ``unique_for`` found already there is not new and is not among them).
job_enqueued = Signal()
#: A worker is about to run a job's handler, on the handler's thread. ``sender``: the ``Worker``
#: class; ``job``: the claimed job (``id``, ``task``, ``args``, ``kwargs``, ``queue``,
#: ``priority``, ``attempt``, ``max_attempts``, ``batch_id``, ``metadata``); ``worker_id``.
job_started = Signal()
#: An attempt ended. ``sender``: the ``Worker`` class; ``job`` as for ``job_started``;
#: ``outcome``: one of ``OUTCOMES``; ``duration``: seconds the handler ran (None if it never
#: started); ``exception``: what it raised, or None; ``worker_id``.
job_finished = Signal()
#: ``sender``: the ``Worker`` class; ``worker``: the worker, once it has started or as it stops.
worker_started = Signal()
worker_stopping = Signal()
#: ``sender``: the ``Elector`` class; ``worker_id``: the worker that now leads, or that no longer
#: does; ``reason`` (resigned only): why.
leader_elected = Signal()
leader_resigned = Signal()

#: The outcomes ``job_finished`` tells apart.
OUTCOMES = (
    "completed",
    "retried",
    "snoozed",
    "failed",
    "discarded",
    "cancelled",
    "handed back",
)


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` to its receivers, if it has any; log what a receiver raises."""
    if not signal.receivers:
        return
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, BaseException):
            logger.error("eddyq: a receiver of a signal raised: %r", receiver, exc_info=result)
