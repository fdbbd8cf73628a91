"""Batches: a group of jobs whose callback task runs once, when the last of them has ended."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction

from django_eddyq import registry, sql
from django_eddyq.arguments import loads, normalize_arguments
from django_eddyq.base import Task, parse_retention, validate_priority, validate_queue_name
from django_eddyq.conf import eddyq_settings
from django_eddyq.models import Batch

if TYPE_CHECKING:
    from django_eddyq.producer import JobSpec

COUNTED_STATES = ("completed", "failed", "cancelled")
MAX_INT4 = 2**31 - 1

# The batch that jobs enqueued here (this thread, this async task) join.
current_batch: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "eddyq_current_batch", default=None
)


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


def complete_batches(cursor: Any, batch_ids: Sequence[int]) -> list[int]:
    """Complete those of the batches whose jobs have all ended, enqueuing their callbacks.

    Call it in the transaction that ended the jobs, on a Django or a psycopg cursor. Returns
    the ids of the batches it completed.
    """
    from django_eddyq.producer import insert_jobs

    ids = sorted(set(batch_ids))
    cursor.execute(sql.LOCK_PENDING_BATCHES, {"ids": ids})
    if not cursor.fetchall():
        return []
    cursor.execute(sql.COMPLETE_BATCHES, {"ids": ids})
    completed = []
    for batch_id, task, args, kwargs, metadata, counts in cursor.fetchall():
        completed.append(batch_id)
        if not task:
            continue
        spec = _callback_spec(batch_id, task, _json(args), _json(kwargs), _json(metadata))
        counted = _json(counts)
        if isinstance(spec.kwargs, dict):
            spec.kwargs["counts"] = {state: counted.get(state, 0) for state in COUNTED_STATES}
        [callback] = insert_jobs([spec], cursor=cursor)
        cursor.execute(sql.SET_BATCH_CALLBACK_JOB, {"id": batch_id, "job_id": callback.pk})
    return completed


def _callback_spec(batch_id: int, task: str, args: Any, kwargs: Any, metadata: Any) -> JobSpec:
    """The callback job of a batch, from its row. A row edited into something ``batch()`` never
    writes still gets its callback job: options that make no sense take their defaults, and
    arguments of the wrong kind are stored as they are, so that the callback job fails saying
    so (``MalformedJob``) rather than the pass that completed the batch."""
    from django_eddyq.producer import JobSpec, default_queue

    options = metadata if isinstance(metadata, dict) else {}
    max_attempts = options.get("callback_max_attempts")
    return JobSpec(
        task=task,
        args=args,
        kwargs={**kwargs, "batch_id": batch_id} if isinstance(kwargs, dict) else kwargs,
        queue=_or_default(validate_queue_name, options.get("callback_queue"), default_queue()),
        priority=_or_default(validate_priority, options.get("callback_priority"), 0),
        max_attempts=(
            max_attempts
            if type(max_attempts) is int and 1 <= max_attempts <= MAX_INT4
            else eddyq_settings.MAX_ATTEMPTS
        ),
        run_at=None,
        delay=0.0,
        retention=_or_default(parse_retention, options.get("callback_retention"), None),
        metadata={"batch_callback": batch_id},
    )


def _or_default[T, D](validate: Callable[[Any], T], value: object, default: D) -> T | D:
    """``validate(value)``, or ``default`` if it is None or invalid."""
    if value is None:
        return default
    try:
        return validate(value)
    except (TypeError, ValueError):
        return default


def _json(value: Any) -> Any:
    """Django's cursor, and the worker's connection, return jsonb as text. Text that Python
    cannot read (an integer of too many digits) reads as None: the callback job then fails,
    saying that its stored value is malformed."""
    if not isinstance(value, str):
        return value
    try:
        return loads(value)
    except ValueError:
        return None
