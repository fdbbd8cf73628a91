"""The one path every enqueue takes: validate, normalise, insert in one statement, notify."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections
from psycopg.types.json import Jsonb

from django_eddyq import sql
from django_eddyq.arguments import normalize_arguments, normalize_json
from django_eddyq.base import validate_queue_name
from django_eddyq.conf import eddyq_settings

if TYPE_CHECKING:
    from django_eddyq.base import Task
    from django_eddyq.models import Job


@dataclasses.dataclass(slots=True, kw_only=True)
class JobSpec:
    """A job about to be inserted, its arguments already normalised to JSON."""

    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    delay: float
    retention: dict[str, float | None] | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    batch_id: int | None = None

    @classmethod
    def for_task(
        cls, task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> JobSpec:
        from django_eddyq.batches import current_batch

        normal_args, normal_kwargs = normalize_arguments(args, kwargs)
        run_at, delay = _due(task.run_at)
        return cls(
            task=task.path,
            args=normal_args,
            kwargs=normal_kwargs,
            queue=task.queue if task.queue is not None else default_queue(),
            priority=task.priority,
            max_attempts=(
                task.max_attempts if task.max_attempts is not None else eddyq_settings.MAX_ATTEMPTS
            ),
            run_at=run_at,
            delay=delay,
            retention=dict(task.retention) if task.retention is not None else None,
            batch_id=current_batch.get(),
        )


def default_queue() -> str:
    return validate_queue_name(eddyq_settings.DEFAULT_QUEUE)


def _due(run_at: datetime | timedelta | None) -> tuple[datetime | None, float]:
    """An absolute time, or a delay the database adds to its own clock."""
    if isinstance(run_at, datetime):
        return run_at, 0.0
    if isinstance(run_at, timedelta):
        return None, run_at.total_seconds()
    return None, 0.0


def insert_jobs(specs: Sequence[JobSpec], cursor: Any = None) -> list[Job]:
    """Insert the jobs in one statement on the queue's database, in the caller's transaction.

    A committed insert wakes idle workers through NOTIFY; a rolled-back one leaves no trace.
    ``cursor``, a Django or psycopg cursor, runs it in that cursor's transaction instead.
    """
    from django_eddyq.models import Job

    if not specs:
        return []
    alias = eddyq_settings.DATABASE
    params: dict[str, Any] = {
        "tasks": [spec.task for spec in specs],
        "args": [Jsonb(spec.args) for spec in specs],
        "kwargs": [Jsonb(spec.kwargs) for spec in specs],
        "queues": [spec.queue for spec in specs],
        "priorities": [spec.priority for spec in specs],
        "max_attempts": [spec.max_attempts for spec in specs],
        "run_ats": [spec.run_at for spec in specs],
        "delays": [spec.delay for spec in specs],
        "retentions": [None if spec.retention is None else Jsonb(spec.retention) for spec in specs],
        "metadatas": [Jsonb(normalize_json(spec.metadata, where="metadata")) for spec in specs],
        "batch_ids": [spec.batch_id for spec in specs],
    }
    if cursor is None:
        with connections[alias].cursor() as own_cursor:
            own_cursor.execute(sql.INSERT_JOBS, params)
            rows = own_cursor.fetchall()
    else:
        cursor.execute(sql.INSERT_JOBS, params)
        rows = cursor.fetchall()
    jobs = []
    for spec, (job_id, state, run_at, created_at, _woken) in zip(specs, rows, strict=True):
        job = Job(
            id=job_id,
            task=spec.task,
            args=spec.args,
            kwargs=spec.kwargs,
            queue=spec.queue,
            priority=spec.priority,
            state=state,
            attempt=0,
            max_attempts=spec.max_attempts,
            run_at=run_at,
            created_at=created_at,
            errors=[],
            retention=spec.retention,
            metadata=spec.metadata,
            batch_id=spec.batch_id,
        )
        job._state.adding = False
        job._state.db = alias
        jobs.append(job)
    return jobs
