"""Operations on jobs, queues and batches from the outside: cancel, retry and delete a job (or
a batch of ids, by one statement: ``bulk.py`` walks every job of a filter with them), pause and
resume a queue, complete the batches whose jobs have all ended. Each is one short transaction,
with the notifications it owes; the models' methods, the admin, the command line and the worker
call them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from django.db import connections, transaction

from django_eddyq import sql, steps
from django_eddyq.arguments import loads
from django_eddyq.conf import eddyq_settings
from django_eddyq.enqueue import JobSpec, default_queue, insert_jobs
from django_eddyq.limits import Limits, Rate
from django_eddyq.retention import parse_retention
from django_eddyq.vocabulary import (
    TERMINAL_STATES,
    JobState,
    validate_priority,
    validate_queue_name,
)

MAX_INT4 = 2**31 - 1


class ChangedJob(NamedTuple):
    """A job an operation changed (or, in a dry run, would change), and its state after it
    (a running job being cancelled stays running, asked to stop)."""

    id: int
    task: str
    state: str


def cancel_job(job_id: int) -> bool:
    """Cancel the job now, or, running, ask its worker to stop it; False if it had ended or
    was already being cancelled."""
    alias = eddyq_settings.DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        return bool(cancel_many(cursor, [job_id]))


def retry_job(job_id: int) -> bool:
    """Make the job available now; False if it was already available or running. Raises
    ``ValueError`` for a completed job."""
    alias = eddyq_settings.DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        if retry_many(cursor, [job_id]):
            return True
        cursor.execute(sql.JOB_STATE, {"id": job_id})
        row = cursor.fetchone()
    if row is not None and row[0] == JobState.COMPLETED:
        raise ValueError(f"job {job_id} completed: a completed job cannot be retried")
    return False


def delete_job(job_id: int) -> bool:
    """Delete the job if it has ended (cancel it first otherwise)."""
    with connections[eddyq_settings.DATABASE].cursor() as cursor:
        return bool(delete_many(cursor, [job_id]))


def cancel_many(cursor: Any, ids: Sequence[int]) -> list[ChangedJob]:
    """Cancel those of the jobs ``ids`` that ``cancel_job`` would, completing the batches this
    ends, in the caller's transaction; the jobs changed."""
    cursor.execute(sql.CANCEL_JOBS, {"ids": list(ids)})
    rows = cursor.fetchall()
    ended_batches = [row[3] for row in rows if row[2] == JobState.CANCELLED and row[3]]
    if ended_batches:
        complete_batches(cursor, ended_batches)
    steps.settle_ended(cursor, [row[0] for row in rows if row[2] == JobState.CANCELLED])
    return [ChangedJob(*row[:3]) for row in rows]


def retry_many(cursor: Any, ids: Sequence[int]) -> list[ChangedJob]:
    """Retry those of the jobs ``ids`` that ``retry_job`` would; the jobs changed."""
    cursor.execute(sql.RETRY_JOBS, {"ids": list(ids)})
    retried = [ChangedJob(*row[:3]) for row in cursor.fetchall()]
    # A retried step of a workflow may have to wait for its dependencies again.
    steps.settle_retried(cursor, [job.id for job in retried])
    return retried


def delete_many(cursor: Any, ids: Sequence[int]) -> list[ChangedJob]:
    """Delete those of the jobs ``ids`` that have ended; the jobs deleted."""
    cursor.execute(sql.DELETE_JOBS, {"ids": list(ids)})
    return [ChangedJob(*row) for row in cursor.fetchall()]


def set_queue_paused(name: str, *, paused: bool) -> None:
    """Pause or resume the queue ``name`` (its row created if needed); resuming wakes idle
    workers at once."""
    validate_queue_name(name)
    with connections[eddyq_settings.DATABASE].cursor() as cursor:
        cursor.execute(sql.SET_QUEUE_PAUSED, {"name": name, "paused": paused})
        if not paused:
            cursor.execute(sql.NOTIFY_QUEUE, {"name": name})


def set_queue_limits(
    name: str,
    *,
    concurrency: int | None = None,
    rate: str | Rate | None = None,
    burst: int | None = None,
) -> Limits:
    """Limit the queue ``name`` across every worker: at most ``concurrency`` of its jobs
    running, at most ``rate`` ("100/m") started per period, ``burst`` at once at most (by
    default a second's worth of the rate); None lifts a limit. Its row is created if needed;
    workers follow within a poll interval, without restarting. Returns the limits set.
    ValueError names what is wrong, and nothing is changed."""
    validate_queue_name(name)
    limits = Limits.from_options({"concurrency": concurrency, "rate": rate, "burst": burst})
    with connections[eddyq_settings.DATABASE].cursor() as cursor:
        cursor.execute(
            sql.SET_QUEUE_LIMITS,
            {
                "name": name,
                "concurrency": limits.concurrency,
                "rate_limit": limits.rate.limit if limits.rate else None,
                "rate_period": limits.rate.period_seconds if limits.rate else None,
                "rate_burst": limits.rate.burst if limits.rate else None,
            },
        )
        # A raised limit lets idle workers take more at once.
        cursor.execute(sql.NOTIFY_QUEUE, {"name": name})
    return limits


def apply_configured_limits() -> None:
    """Set the limits of the queues of ``EDDYQ["QUEUES"]`` as configured (a worker does it as
    it starts: what the settings say wins over a change made at run time, at the next
    deployment)."""
    for name, limits in eddyq_settings.QUEUES.items():
        set_queue_limits(
            name,
            concurrency=limits.concurrency,
            rate=limits.rate,
            burst=limits.rate.burst if limits.rate else None,
        )


def complete_batches(cursor: Any, batch_ids: Sequence[int]) -> list[int]:
    """Complete those of the batches whose jobs have all ended, enqueuing their callbacks.

    Call it in the transaction that ended the jobs, on a Django or a psycopg cursor. Returns
    the ids of the batches it completed.
    """
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
            spec.kwargs["counts"] = {state: counted.get(state, 0) for state in TERMINAL_STATES}
        # A trace of its own: the context current here (a pass's, a request's) is not its.
        [callback] = insert_jobs([spec], cursor=cursor, own_trace=True)
        cursor.execute(sql.SET_BATCH_CALLBACK_JOB, {"id": batch_id, "job_id": callback.pk})
    return completed


def _callback_spec(batch_id: int, task: str, args: Any, kwargs: Any, metadata: Any) -> JobSpec:
    """The callback job of a batch, from its row. A row edited into something ``batch()`` never
    writes still gets its callback job: options that make no sense take their defaults, and
    arguments of the wrong kind are stored as they are, so that the callback job fails saying
    so (``MalformedJob``) rather than the pass that completed the batch."""
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
