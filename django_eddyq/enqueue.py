"""The one path every enqueue takes: validate, normalise, insert in one statement, notify."""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import inspect
import itertools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from django.apps import apps
from django.db import connections, transaction
from django.db.models.base import ModelState
from psycopg.copy import QueuedLibpqWriter
from psycopg.types.json import Jsonb

from django_eddyq import db, sql, tracing
from django_eddyq.arguments import dumps, normalize_arguments, normalize_json
from django_eddyq.conf import eddyq_settings
from django_eddyq.limits import WHOLE_TASK_KEY, limit_key
from django_eddyq.signals import job_enqueued, send
from django_eddyq.vocabulary import validate_queue_name

if TYPE_CHECKING:
    from django_eddyq.models import Job
    from django_eddyq.tasks import Task

# The batch that jobs enqueued here (this thread, this async task) join; set by ``batch()``.
current_batch: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "eddyq_current_batch", default=None
)


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
    unique_key: str | None = None
    unique_for: float | None = None  # seconds a completed job keeps its key; None: not at all
    limit_key: str | None = None  # the key its task's limits count it under; None: no limits

    @classmethod
    def for_task(
        cls, task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> JobSpec:
        return cls.for_calls(task, [(args, kwargs)])[0]

    @classmethod
    def for_calls(
        cls, task: Task[Any, Any], calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[JobSpec]:
        """One spec per call of ``task``; what the task decides is looked up once, not per job."""
        run_at, delay = due_time(task.run_at)
        queue = task.queue if task.queue is not None else default_queue()
        max_attempts = (
            task.max_attempts if task.max_attempts is not None else eddyq_settings.MAX_ATTEMPTS
        )
        batch_id = current_batch.get()
        unique_for = task.unique_for.total_seconds() if task.unique_for is not None else None
        keyed = task.unique_key is not None or task.unique_for is not None
        path, priority, retention = task.path, task.priority, task.retention
        metadata = task.metadata
        limited, key = task.limits is not None, task.key
        signature = key_signature(task.func) if key is not None else None
        specs = []
        for args, kwargs in calls:
            normal_args, normal_kwargs = normalize_arguments(args, kwargs)
            job_limit_key = None
            if limited:
                job_limit_key = (
                    WHOLE_TASK_KEY
                    if key is None
                    else key_of(key, signature, path, normal_args, normal_kwargs)
                )
            specs.append(
                cls(
                    task=path,
                    args=normal_args,
                    kwargs=normal_kwargs,
                    queue=queue,
                    priority=priority,
                    max_attempts=max_attempts,
                    run_at=run_at,
                    delay=delay,
                    retention=dict(retention) if retention is not None else None,
                    batch_id=batch_id,
                    unique_key=(
                        _unique_key(task, normal_args, normal_kwargs, queue) if keyed else None
                    ),
                    unique_for=unique_for,
                    metadata=dict(metadata) if metadata else {},
                    limit_key=job_limit_key,
                )
            )
        return specs


def key_signature(func: Callable[..., Any], *, takes_context: bool = False) -> inspect.Signature:
    """The parameters a task's key function is given by name: the task function's, but the
    context a Django task takes first."""
    signature = inspect.signature(func)
    if takes_context:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return signature


def key_of(
    key: Callable[..., object],
    signature: inspect.Signature | None,
    path: str,
    args: list[Any],
    kwargs: dict[str, Any],
) -> str:
    """The limit key of a job of task ``path`` with these (normalised) arguments: ``key``'s
    answer, checked (``limits.limit_key``). TypeError or ValueError names the task."""
    call_args, call_kwargs = _key_arguments(signature, args, kwargs)
    try:
        value = key(*call_args, **call_kwargs)
    except Exception as error:
        raise TypeError(
            f"the key of task {path} failed on args {args!r} and kwargs {kwargs!r}: {error!r}"
        ) from error
    return limit_key(value, task=path)


def _key_arguments(
    signature: inspect.Signature | None, args: list[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """A call's arguments for its task's key function: by name (the task's parameters, their
    defaults filled in), so that ``lambda customer_id, **_: customer_id`` reads the argument
    however it was passed; as given when the task takes ``*args`` or the call does not fit."""
    if signature is None or any(
        parameter.kind is inspect.Parameter.VAR_POSITIONAL
        for parameter in signature.parameters.values()
    ):
        return args, kwargs
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    bound.apply_defaults()
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return [], named


def _unique_key(
    task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any], queue: str
) -> str | None:
    """The explicit key, scoped to the task; or, with ``unique_for``, one of the arguments."""
    if task.unique_key is not None:
        return f"{task.path}:key:{task.unique_key}"
    if task.unique_for is None:
        return None
    canonical = json.dumps([args, kwargs, queue], sort_keys=True, separators=(",", ":"))
    return f"{task.path}:args:{hashlib.sha256(canonical.encode()).hexdigest()}"


def default_queue() -> str:
    return validate_queue_name(eddyq_settings.DEFAULT_QUEUE)


def due_time(run_at: datetime | timedelta | None) -> tuple[datetime | None, float]:
    """``run_at`` as ``(time, delay)``: an absolute time, or a delay (in seconds) that the
    database adds to its own clock."""
    if isinstance(run_at, datetime):
        return run_at, 0.0
    if isinstance(run_at, timedelta):
        return None, run_at.total_seconds()
    return None, 0.0


def enqueue_calls(
    task: Task[Any, Any], calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]]
) -> list[Job]:
    """A job of ``task`` for each ``(args, kwargs)`` of ``calls``, all of them or none.

    From ``COPY_THRESHOLD`` calls (of a task whose jobs are neither unique nor limited per key),
    each call's arguments
    are checked as its row is written: checking, writing and the database's work overlap, and
    an invalid call rolls back the rows before it.
    """
    if (
        len(calls) < COPY_THRESHOLD
        or task.unique_key is not None
        or task.unique_for is not None
        or task.limits is not None
    ):
        return insert_jobs(JobSpec.for_calls(task, calls))
    template = JobSpec.for_task(task, (), {})
    if (spans := tracing.spans()) is not None:
        return spans.publish(
            [template],
            lambda: _copy_calls(eddyq_settings.DATABASE, template, calls),
            count=len(calls),
        )
    return _copy_calls(eddyq_settings.DATABASE, template, calls)


def insert_jobs(
    specs: Sequence[JobSpec], cursor: Any = None, *, own_trace: bool = False
) -> list[Job]:
    """Insert the jobs in one statement on the queue's database, in the caller's transaction.

    A committed insert wakes idle workers through NOTIFY; a rolled-back one leaves no trace.
    ``cursor``, a Django or psycopg cursor, runs it in that cursor's transaction instead.
    With tracing on, in a producer span; ``own_trace``: one that starts a trace of its own
    (batch callbacks, periodic runs: see ``tracing``).
    """
    if not specs:
        return []
    if (spans := tracing.spans()) is not None:
        return spans.publish(specs, lambda: _insert_jobs(specs, cursor), own_trace=own_trace)
    return _insert_jobs(specs, cursor)


def _insert_jobs(specs: Sequence[JobSpec], cursor: Any) -> list[Job]:
    alias = eddyq_settings.DATABASE
    touch = _queues_to_touch(
        alias, {spec.queue for spec in specs}, django_transaction=cursor is None
    )
    if len(specs) == 1 and specs[0].unique_key is None and specs[0].limit_key is None and not touch:
        return _insert_one(alias, specs[0], cursor)
    params: dict[str, Any] = {
        "tasks": [spec.task for spec in specs],
        "args": [Jsonb(spec.args, dumps) for spec in specs],
        "kwargs": [Jsonb(spec.kwargs, dumps) for spec in specs],
        "queues": [spec.queue for spec in specs],
        "priorities": [spec.priority for spec in specs],
        "max_attempts": [spec.max_attempts for spec in specs],
        "run_ats": [spec.run_at for spec in specs],
        "delays": [spec.delay for spec in specs],
        "retentions": [None if spec.retention is None else Jsonb(spec.retention) for spec in specs],
        "metadatas": [Jsonb(normalize_json(spec.metadata, where="metadata")) for spec in specs],
        "batch_ids": [spec.batch_id for spec in specs],
        "unique_keys": [spec.unique_key for spec in specs],
        "limit_keys": [spec.limit_key for spec in specs],
    }
    unique = any(spec.unique_key is not None for spec in specs)
    statement = sql.INSERT_JOBS[(touch, unique)]
    if not unique:
        return _enqueued(_jobs(alias, specs, _fetch_all(alias, cursor, statement, params)))
    return _insert_unique(alias, specs, statement, params)


def _insert_one(alias: str, spec: JobSpec, cursor: Any) -> list[Job]:
    params = {
        "task": spec.task,
        "args": dumps(spec.args),
        "kwargs": dumps(spec.kwargs),
        "queue": spec.queue,
        "priority": spec.priority,
        "max_attempts": spec.max_attempts,
        "run_at": spec.run_at,
        "delay": spec.delay,
        "retention": None if spec.retention is None else dumps(spec.retention),
        "metadata": dumps(normalize_json(spec.metadata, where="metadata")),
        "batch_id": spec.batch_id,
    }
    return _enqueued(_jobs(alias, [spec], _fetch_all(alias, cursor, sql.INSERT_ONE_JOB, params)))


def _fetch_all(
    alias: str, cursor: Any, statement: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """Run ``statement`` on ``cursor``, or on a cursor of Django's connection for ``alias``."""
    if cursor is not None:
        cursor.execute(statement, params)
        return list(cursor.fetchall())
    with bound_cursor(alias) as own_cursor:
        own_cursor.execute(statement, params)
        return own_cursor.fetchall()


# From this many jobs, enqueue_many streams them with COPY, several times faster than an INSERT
# of that many rows; below it, the single INSERT statement costs less.
COPY_THRESHOLD = 1000
# Rows sent to COPY per write.
COPY_CHUNK = 1000
COPY_NULL = "\\N"
COPY_SPECIAL = re.compile(r"[\\\t\n\r]")
COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_calls(
    alias: str, template: JobSpec, calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]]
) -> list[Job]:
    """Insert a job like ``template`` for each call with COPY, in one transaction: ids and the
    database's clock first, then the rows, then the queue row and the wake-up, exactly as the
    INSERT would.

    Every column but the id and the arguments is the template's, so each row is its id and
    arguments between two fixed pieces of text, and each ``Job`` a copy of one dict. While a
    chunk of calls is checked and written, a writer thread sends the previous one.
    """
    job_model = _job_model()
    with transaction.atomic(using=alias), bound_cursor(alias) as cursor:
        cursor.execute(sql.RESERVE_JOB_IDS, {"count": len(calls)})
        now, ids = cursor.fetchone()  # type: ignore[misc]
        run_at = now
        if template.run_at is not None or template.delay:
            run_at = template.run_at or now + timedelta(seconds=template.delay)
        state = "scheduled" if run_at > now else "available"
        metadata = normalize_json(template.metadata, where="metadata")
        statement, run_at_column = (
            (sql.COPY_JOBS_RUN_AT_NOW, "")
            if run_at == now
            else (sql.COPY_JOBS, f"{run_at.isoformat()}\t")
        )
        head = f"\t{_copy_text(template.task)}\t"
        tail = (
            f"\t{_copy_text(template.queue)}\t{template.priority}\t{state}\t0\t"
            f"{template.max_attempts}\t{run_at_column}[]\t"
            f"{COPY_NULL if template.retention is None else _copy_json(template.retention)}\t"
            f"{_copy_json(metadata)}\t"
            f"{COPY_NULL if template.batch_id is None else template.batch_id}\n"
        )
        fields = _job_fields(template, state, run_at, now, None)
        jobs: list[Job] = []
        with cursor.copy(statement, writer=QueuedLibpqWriter(cursor)) as copy:
            for chunk in itertools.batched(zip(calls, ids, strict=True), COPY_CHUNK):
                lines = []
                for (given_args, given_kwargs), job_id in chunk:
                    args, kwargs = normalize_arguments(given_args, given_kwargs)
                    lines.append(f"{job_id}{head}{_copy_json(args)}\t{_copy_json(kwargs)}{tail}")
                    jobs.append(
                        _job(
                            job_model,
                            alias,
                            fields,
                            job_id,
                            args,
                            kwargs,
                            None if template.retention is None else dict(template.retention),
                            dict(template.metadata),
                        )
                    )
                copy.write("".join(lines))
        if _queues_to_touch(alias, {template.queue}, django_transaction=True):
            cursor.execute(sql.CREATE_AND_TOUCH_QUEUES, {"queues": [template.queue]})
        cursor.execute(
            sql.NOTIFY_NEW_JOBS,
            {
                "available_queues": [template.queue] if state == "available" else [],
                "scheduled": state == "scheduled",
            },
        )
    return _enqueued(jobs)


def _copy_json(value: Any) -> str:
    # JSON text never holds a raw tab, newline or carriage return (json escapes them), but its
    # backslashes must be doubled for COPY.
    if not value:
        return "[]" if isinstance(value, list) else "{}"
    text = dumps(value)
    return text.replace("\\", "\\\\") if "\\" in text else text


def _copy_text(text: str) -> str:
    return text.translate(COPY_ESCAPES) if COPY_SPECIAL.search(text) else text


@contextmanager
def bound_cursor(alias: str) -> Iterator[psycopg.Cursor[Any]]:
    """A cursor on the very connection (and transaction) Django uses for ``alias``, binding
    parameters on the server: Django's default cursor would quote every element of the big
    arrays into the SQL text, the slowest part of a large ``enqueue_many``.

    Its statements are prepared as the queue's own connections' are (``db.prepare_threshold``):
    planning the one-job insert took as long as running it. Only for this cursor: Django's
    own, and the project's, go on as configured.
    """
    connection = connections[alias]
    connection.ensure_connection()
    raw = connection.connection
    configured = raw.prepare_threshold
    raw.prepare_threshold = db.prepare_threshold(alias)
    try:
        with connection.wrap_database_errors, psycopg.Cursor(raw) as cursor:
            yield cursor
    finally:
        raw.prepare_threshold = configured


def _insert_unique(
    alias: str, specs: Sequence[JobSpec], statement: str, params: dict[str, Any]
) -> list[Job]:
    """Insert unless a job holds the key; return, per spec, the new job or the holder.

    Enforced by the unique index, so concurrent enqueues of one key make one row: the second
    waits for the first's transaction and then finds its job.
    """
    keys = [spec.unique_key for spec in specs]
    windows = [spec.unique_for for spec in specs]
    with transaction.atomic(using=alias), bound_cursor(alias) as cursor:
        cursor.execute(sql.RELEASE_UNIQUE_KEYS, {"unique_keys": keys, "windows": windows})
        cursor.execute(statement, params)
        rows = cursor.fetchall()
    first_spec = {spec.unique_key: spec for spec in reversed(specs)}
    inserted = _enqueued(_jobs(alias, [first_spec[row[4]] for row in rows], rows))
    by_key: dict[str | None, Job] = {job.unique_key: job for job in inserted}
    missing = [key for key in keys if key not in by_key]
    if missing:
        holders = _job_model().all_objects.using(alias).filter(unique_key__in=missing)
        by_key.update((holder.unique_key, holder) for holder in holders)
    return [by_key[key] for key in keys]


# When this process last created or touched each queue's row: at most once every few seconds.
TOUCH_QUEUE_SECONDS = 5.0
_queues_touched_at: dict[tuple[str, str], float] = {}


def stale_keys[K](touched_at: dict[K, float], keys: Iterable[K], now: float) -> list[K]:
    """The keys last touched at least TOUCH_QUEUE_SECONDS before ``now``, or never."""
    return [
        key
        for key in set(keys)
        if now - touched_at.get(key, -TOUCH_QUEUE_SECONDS) >= TOUCH_QUEUE_SECONDS
    ]


def due_for_touch[K](touched_at: dict[K, float], keys: Iterable[K]) -> list[K]:
    """The stale keys, marked touched now."""
    now = time.monotonic()
    due = stale_keys(touched_at, keys, now)
    touched_at.update(dict.fromkeys(due, now))
    return due


def _queues_to_touch(alias: str, queues: set[str], *, django_transaction: bool) -> bool:
    """Whether this insert should create and touch the rows of its ``queues``.

    Through Django's connection the touch counts only once committed: after a rollback, the
    next enqueue must still create the row.
    """
    keys = {(alias, queue) for queue in queues}
    if not django_transaction:
        return bool(due_for_touch(_queues_touched_at, keys))
    now = time.monotonic()
    due = stale_keys(_queues_touched_at, keys, now)
    if due:
        transaction.on_commit(
            lambda: _queues_touched_at.update(dict.fromkeys(due, now)), using=alias
        )
    return bool(due)


def _jobs(alias: str, specs: Sequence[JobSpec], rows: Sequence[tuple[Any, ...]]) -> list[Job]:
    """The inserted jobs as model instances."""
    job_model = _job_model()
    return [
        _job(
            job_model,
            alias,
            _job_fields(spec, state, run_at, created_at, unique_key),
            job_id,
            spec.args,
            spec.kwargs,
            spec.retention,
            spec.metadata,
        )
        for spec, (job_id, state, run_at, created_at, unique_key, *_) in zip(
            specs, rows, strict=True
        )
    ]


def _job_fields(
    spec: JobSpec, state: str, run_at: datetime, created_at: datetime, unique_key: str | None
) -> dict[str, Any]:
    """The field values of a job just inserted from ``spec``; ``_job`` fills in the rest.

    Every key of the instance's ``__dict__`` is here already, so that each job's copy of it
    is made at its final size (adding keys to the copy grew it: a tenth of ``_job``'s time).
    """
    return {
        "task": spec.task,
        "queue": spec.queue,
        "priority": spec.priority,
        "state": state,
        "attempt": 0,
        "max_attempts": spec.max_attempts,
        "run_at": run_at,
        "created_at": created_at,
        "attempted_at": None,
        "attempted_by": None,
        "finalized_at": None,
        "locked_by": None,
        "locked_until": None,
        "heartbeat_at": None,
        "result": None,
        "batch_id": spec.batch_id,
        "cancel_requested_at": None,
        "unique_key": unique_key,
        "limit_key": spec.limit_key,
        "id": None,
        "args": None,
        "kwargs": None,
        "errors": None,
        "retention": None,
        "metadata": None,
        "_state": None,
    }


def _enqueued(jobs: list[Job]) -> list[Job]:
    """``jobs``, newly inserted, once ``signals.job_enqueued`` has told its receivers."""
    if job_enqueued.receivers:  # the sender is looked up only for a signal someone hears
        send(job_enqueued, _job_model(), jobs=jobs)
    return jobs


def _job_model() -> type[Job]:
    """The ``Job`` model, from Django's app registry: importing it here would need the apps
    ready whenever the package is imported, which settings and tasks modules do early."""
    model: type[Job] = apps.get_model("django_eddyq", "Job")
    return model


def _job(
    model: type[Job],
    alias: str,
    fields: dict[str, Any],
    job_id: int,
    args: list[Any],
    kwargs: dict[str, Any],
    retention: dict[str, float | None] | None,
    metadata: dict[str, Any],
) -> Job:
    """A job as a model instance, built as ``Model.from_db`` would build it but without
    ``__init__``'s per-field work, which dominated a large ``enqueue_many``. Its mutable
    values are its own."""
    job = model.__new__(model)
    state = ModelState()
    state.adding = False
    state.db = alias
    values = fields.copy()
    values["id"] = job_id
    values["args"] = args
    values["kwargs"] = kwargs
    values["errors"] = []
    values["retention"] = retention
    values["metadata"] = metadata
    values["_state"] = state
    job.__dict__ = values
    return job
