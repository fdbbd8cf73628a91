"""Batches: a group of jobs whose callback task runs once, when the last of them has ended."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connections, transaction

from django_eddyq import registry, sql
from django_eddyq.arguments import normalize_arguments
from django_eddyq.conf import eddyq_settings
from django_eddyq.enqueue import current_batch
from django_eddyq.models import Batch
from django_eddyq.operations import complete_batches
from django_eddyq.tasks import Task


@contextmanager
def batch(
    on_complete: Task[..., Any] | str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> Iterator[Batch]:
    """Group the jobs enqueued in the block (on this thread); yields the ``Batch``.

    When every job of the batch has ended (completed, failed or cancelled), ``on_complete`` is
    enqueued exactly once with ``args`` and ``kwargs`` plus ``batch_id=`` and
    ``counts={"completed": n, "failed": n, "cancelled": n}``, and the batch becomes
    ``complete``. The batch is sealed when the block exits, so the callback cannot fire while
    jobs are still being added; an empty batch completes at once. Inside a transaction, a
    rollback takes the batch and its jobs away together. A callback given by path must be a
    registered task (``TaskNotFound`` otherwise).
    """
    callback_args, callback_kwargs = normalize_arguments(args, kwargs or {})
    metadata: dict[str, Any] = {}
    if isinstance(on_complete, str):
        registry.lookup(on_complete)
    if isinstance(on_complete, Task):
        callback_task = on_complete.path
        metadata = {
            "callback_queue": on_complete.queue,
            "callback_priority": on_complete.priority,
            "callback_max_attempts": on_complete.max_attempts,
            "callback_retention": on_complete.retention,
        }
    else:
        callback_task = on_complete or ""
    created = Batch.objects.create(
        callback_task=callback_task,
        callback_args=callback_args,
        callback_kwargs=callback_kwargs,
        metadata=metadata,
    )
    token = current_batch.set(created.pk)
    failed = True
    try:
        yield created
        failed = False
    finally:
        current_batch.reset(token)
        connection = connections[eddyq_settings.DATABASE]
        if not (failed and connection.needs_rollback):
            try:
                seal(created.pk)
            except DatabaseError:
                if not failed:
                    raise  # otherwise the block's own error is the one to see
    created.refresh_from_db()


def seal(batch_id: int) -> None:
    """No more jobs join the batch; it completes now if all its jobs have already ended."""
    alias = eddyq_settings.DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(sql.SEAL_BATCH, {"id": batch_id})
        complete_batches(cursor, [batch_id])
