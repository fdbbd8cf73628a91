"""Tasks: the ``@task`` decorator and enqueueing.

``@task`` reads no settings: defaults (queue, attempts) resolve when a job is enqueued.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, overload

from asgiref.sync import sync_to_async
from croniter import croniter
from django.utils import timezone

from django_eddyq import registry
from django_eddyq.arguments import normalize_json
from django_eddyq.durations import MAX_DELAY, parse_duration
from django_eddyq.enqueue import JobSpec, enqueue_calls, insert_jobs
from django_eddyq.handlers import Handler
from django_eddyq.limits import Limits
from django_eddyq.retention import parse_retention
from django_eddyq.vocabulary import validate_positive_int, validate_priority, validate_queue_name

if TYPE_CHECKING:
    from django_eddyq.models import Job

type Backoff = Callable[[int], float | timedelta]
#: Computes a job's limit key from its arguments (as JSON gives them back): a str or an int.
type KeyFunction = Callable[..., str | int]

#: Tasks declared with ``@task(cron=...)``, by path: the periodic enqueuer's schedules.
SCHEDULED_TASKS: dict[str, Task[..., Any]] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class Signature:
    """A task with its arguments, to run later as a workflow's step: ``task.s(*args, **kwargs)``.

    Its arguments are checked and normalised when it is made, so that a workflow is refused at
    ``add`` for them, before anything is stored.
    """

    spec: JobSpec

    @property
    def task(self) -> str:
        return self.spec.task

    @property
    def name(self) -> str:
        """The task's own name, the last part of its path: a step's default name."""
        return self.spec.task.rpartition(".")[2]


def signature_of(spec: JobSpec) -> Signature:
    """The signature of a job ``spec``: no batch (a step is no part of one), no unique key."""
    if spec.unique_key is not None:
        raise ValueError(f"task {spec.task} has jobs unique by key: it cannot be a workflow step")
    spec.batch_id = None
    return Signature(spec)


class Call:
    """The arguments of one call, for ``enqueue_many`` items with both kinds of argument.

    ``send.enqueue_many([Call(1, lang="fr"), (2,), {"user_id": 3}])``
    """

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"Call(*{self.args!r}, **{self.kwargs!r})"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Task[**P, R]:
    """A function that can be enqueued; made by ``@task``, refined by ``using()``."""

    func: Callable[P, R]
    queue: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    timeout: timedelta | None = None
    backoff: Backoff | None = None
    retention: Mapping[str, float | None] | None = None
    run_at: datetime | timedelta | None = None
    cron: str | None = None
    unique_for: timedelta | None = None
    unique_key: str | None = None
    metadata: Mapping[str, Any] | None = None
    limits: Limits | None = None  # per key, across every worker
    key: KeyFunction | None = None  # None with limits: the task is limited as a whole
    atomic: bool = False

    def __post_init__(self) -> None:
        if self.queue is not None:
            validate_queue_name(self.queue)
        validate_priority(self.priority)
        if self.max_attempts is not None:
            validate_positive_int(self.max_attempts, "max_attempts")
        if self.run_at is not None:
            validate_run_at(self.run_at)
        if self.cron is not None:
            validate_cron(self.cron)
        if self.key is not None and not self.limits:
            raise ValueError(
                f"task {self.path} has a key but no limit: give concurrency= or rate= with it"
            )
        if self.key is not None and not callable(self.key):
            raise TypeError(f"the key of task {self.path} must be a function of its arguments")

    @property
    def path(self) -> str:
        """``module.qualname``: how a worker finds this task again."""
        return f"{self.func.__module__}.{self.func.__qualname__}"

    @property
    def name(self) -> str:
        return self.func.__name__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function here and now, as a plain call."""
        return self.func(*args, **kwargs)

    def using(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_at: datetime | timedelta | None = None,
        max_attempts: int | None = None,
        retention: Mapping[str, object] | None = None,
        unique_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Task[P, R]:
        """Return a copy with these options changed; ``run_at`` may be a delay.

        ``unique_key`` makes the job unique by that key (scoped to the task) instead of by its
        arguments: while a job with the key is unfinished, or completed within the task's
        ``unique_for``, enqueueing returns that job instead of a new one. ``metadata``, JSON
        with string keys, is stored with the job and given to its handler by ``current_job()``
        (beside the keys the queue writes itself, which it may not use).
        """
        changes: dict[str, Any] = {}
        if queue is not None:
            changes["queue"] = queue
        if priority is not None:
            changes["priority"] = priority
        if run_at is not None:
            changes["run_at"] = run_at
        if max_attempts is not None:
            changes["max_attempts"] = max_attempts
        if retention is not None:
            changes["retention"] = parse_retention(retention)
        if unique_key is not None:
            if not isinstance(unique_key, str) or not unique_key:
                raise ValueError(f"unique_key must be a non-empty string, not {unique_key!r}")
            changes["unique_key"] = unique_key
        if metadata is not None:
            changes["metadata"] = _checked_metadata(metadata)
        return dataclasses.replace(self, **changes)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """This task with these arguments, as a workflow's step (``Workflow.add``)."""
        if self.unique_for is not None:
            raise ValueError(f"task {self.path} has unique jobs: it cannot be a workflow step")
        return signature_of(JobSpec.for_task(self, args, kwargs))

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Store one job; part of the current transaction on the queue's database."""
        return insert_jobs([JobSpec.for_task(self, args, kwargs)])[0]

    def enqueue_many(self, calls: Iterable[Sequence[Any] | Mapping[str, Any] | Call]) -> list[Job]:
        """Store many jobs in one round trip: all of them, or none if any argument is invalid.

        Each item is a tuple of positional arguments, a dict of keyword arguments, or a
        ``Call(*args, **kwargs)`` for both.
        """
        return enqueue_calls(self, [_split_call(call, index) for index, call in enumerate(calls)])

    # From async code: the insert runs where Django's async ORM runs its queries
    # (sync_to_async, thread_sensitive), so it joins that connection's transaction, if any.

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """``enqueue`` for async code (an async view): ``await task.aenqueue(...)``."""
        spec = JobSpec.for_task(self, args, kwargs)
        jobs = await sync_to_async(insert_jobs, thread_sensitive=True)([spec])
        return jobs[0]

    async def aenqueue_many(
        self, calls: Iterable[Sequence[Any] | Mapping[str, Any] | Call]
    ) -> list[Job]:
        """``enqueue_many`` for async code."""
        split = [_split_call(call, index) for index, call in enumerate(calls)]
        return await sync_to_async(enqueue_calls, thread_sensitive=True)(self, split)


# The keys of a job's metadata that the queue writes itself.
QUEUE_METADATA_KEYS = frozenset(
    {
        "batch_callback",
        "periodic",
        "scheduled_for",
        "django_tasks_backend",
        "otel",
        "workflow",
        "workflow_step",
    }
)


def _checked_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
    taken = sorted(QUEUE_METADATA_KEYS.intersection(metadata))
    if taken:
        raise ValueError(f"metadata keys {taken} are the queue's own: use other names")
    normal = normalize_json(dict(metadata), where="metadata")
    assert isinstance(normal, dict)
    return normal


def _split_call(
    call: Sequence[Any] | Mapping[str, Any] | Call, index: int
) -> tuple[Sequence[Any], Mapping[str, Any]]:
    if isinstance(call, tuple | list):
        return call, {}
    if isinstance(call, Call):
        return call.args, call.kwargs
    if isinstance(call, Mapping):
        return (), call
    raise TypeError(
        f"enqueue_many item {index} must be a tuple of positional arguments, a dict of keyword "
        f"arguments or a Call(...), not {type(call).__name__}"
    )


@overload
def task[**P, R](function: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task[**P, R](
    *,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    timeout: str | float | timedelta | None = None,
    backoff: Backoff | None = None,
    retention: Mapping[str, object] | None = None,
    cron: str | None = None,
    unique_for: str | float | timedelta | None = None,
    concurrency: int | None = None,
    rate: str | None = None,
    burst: int | None = None,
    key: KeyFunction | None = None,
    atomic: bool = False,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task[**P, R](
    function: Callable[P, R] | None = None,
    /,
    *,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    timeout: str | float | timedelta | None = None,
    backoff: Backoff | None = None,
    retention: Mapping[str, object] | None = None,
    cron: str | None = None,
    unique_for: str | float | timedelta | None = None,
    concurrency: int | None = None,
    rate: str | None = None,
    burst: int | None = None,
    key: KeyFunction | None = None,
    atomic: bool = False,
) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
    """Make a function enqueueable: ``@task`` or ``@task(queue="emails", ...)``.

    ``cron="*/5 * * * *"`` also enqueues it on that schedule (without arguments), once per
    scheduled time, from the elected leader's periodic enqueuer. ``unique_for="1h"``: enqueueing
    it with the same arguments and queue as a job that is unfinished, or completed within the
    last hour, returns that job instead of inserting another. ``atomic=True``: the handler runs
    in a transaction on the queue's database that also writes its job's completion, so that its
    writes commit once, with the completion, or not at all (see docs/atomic-handlers.md).

    ``concurrency=1`` and ``rate="10/s"`` (with ``burst``) limit its jobs across every worker,
    per key: ``key=lambda customer_id, **_: customer_id`` computes a job's key from its
    arguments as it is enqueued (without ``key``, the task is limited as a whole). See
    docs/flow-control.md.

    Declaring a task registers it under its path: workers run the jobs of registered tasks only.
    """

    def wrap(func: Callable[P, R]) -> Task[P, R]:
        try:
            limits = Limits.from_options({"concurrency": concurrency, "rate": rate, "burst": burst})
        except ValueError as error:
            raise ValueError(f"task {func.__module__}.{func.__qualname__}: {error}") from None
        new = Task(
            func=func,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            timeout=None if timeout is None else parse_duration(timeout, name="timeout"),
            backoff=backoff,
            retention=None if retention is None else parse_retention(retention),
            cron=cron,
            unique_for=(
                None if unique_for is None else parse_duration(unique_for, name="unique_for")
            ),
            limits=limits or None,
            key=key,
            atomic=atomic,
        )
        registry.declare(
            new.path,
            new,
            Handler(
                func=func,
                timeout=None if new.timeout is None else new.timeout.total_seconds(),
                backoff=new.backoff,
                limits=new.limits,
                atomic=atomic,
            ),
        )
        if cron is not None:
            SCHEDULED_TASKS[new.path] = new
        return new

    if function is not None:
        return wrap(function)
    return wrap


def validate_run_at(run_at: object) -> None:
    if isinstance(run_at, timedelta):
        if not timedelta(0) <= run_at <= MAX_DELAY:
            raise ValueError(
                f"run_at as a delay must be from 0 to {MAX_DELAY.days} days, not {run_at!r}"
            )
    elif isinstance(run_at, datetime):
        if timezone.is_naive(run_at):
            raise ValueError(f"run_at must be timezone-aware, not the naive {run_at.isoformat()}")
    else:
        raise TypeError(f"run_at must be a datetime or a timedelta, not {type(run_at).__name__}")


def validate_cron(expression: object) -> str:
    if not isinstance(expression, str) or not croniter.is_valid(expression):
        raise ValueError(
            f"cron expression {expression!r} is invalid: use 5 fields (minute hour day month "
            "weekday), or 6 with seconds last"
        )
    return expression
