"""A backend for Django's Tasks framework: ``@django.tasks.task`` functions run on eddyq workers.

``TASKS = {"default": {"BACKEND": "django_eddyq.backend.EddyqBackend"}}`` is all it takes. A
Django task's job goes through the one internal enqueue path (``producer.insert_jobs``) like an
eddyq task's, into the same table, run by the same workers; its ``task`` column holds the Django
task's ``module_path``, from which a worker finds the Django ``Task`` again (``handlers.resolve``)
and runs it with the hooks below: its ``TaskContext``, and Django's ``task_started`` and
``task_finished`` signals.

A ``TaskResult`` is read from the job: see ``result_from_job`` for how each field maps.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from django_eddyq import registry
from django_eddyq.arguments import normalize_arguments
from django_eddyq.compat import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_eddyq.conf import did_you_mean
from django_eddyq.durations import MAX_DELAY, parse_duration
from django_eddyq.enqueue import (
    JobSpec,
    current_batch,
    due_time,
    insert_jobs,
    key_of,
    key_signature,
)
from django_eddyq.exceptions import TaskNotFound
from django_eddyq.handlers import Handler
from django_eddyq.limits import WHOLE_TASK_KEY, Limits
from django_eddyq.models import Job
from django_eddyq.retention import parse_retention
from django_eddyq.tasks import Signature, signature_of
from django_eddyq.tasks import Task as EddyqOwnTask
from django_eddyq.vocabulary import (
    TERMINAL_STATES,
    JobState,
    validate_positive_int,
    validate_queue_name,
)

if TYPE_CHECKING:
    from django_eddyq.worker.execution import ClaimedJob, Outcome

    _TaskBase = Task[..., Any]
else:
    # Django's Task is generic only in django-stubs.
    _TaskBase = Task

#: The job's ``metadata`` key naming the TASKS alias a Django task was enqueued through.
BACKEND_METADATA_KEY = "django_tasks_backend"
OPTIONS = ("MAX_ATTEMPTS", "ATOMIC")
DEFAULT_MAX_ATTEMPTS = 1
# A job id as a result id: what ``str(job.pk)`` gives for a bigint primary key.
_RESULT_ID = re.compile(r"[1-9][0-9]{0,18}")
_BIGINT_MAX = 2**63 - 1

STATUS_OF_STATE: Mapping[str, TaskResultStatus] = {
    JobState.SCHEDULED: TaskResultStatus.READY,
    JobState.AVAILABLE: TaskResultStatus.READY,
    JobState.RETRYABLE: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EddyqTask(_TaskBase):
    """A Django ``Task`` with eddyq's options; the ``task_class`` of ``EddyqBackend``.

    On Django 6.1 (and with the django-tasks backport) ``@task(max_attempts=5, timeout="1m",
    retention={"failed": "30d"})`` sets them; ``using(max_attempts=..., retention=...)`` works
    everywhere. ``timeout`` takes what eddyq's ``@task`` takes (seconds, ``"1m"``, a
    ``timedelta``); ``max_attempts`` None means the backend's ``OPTIONS["MAX_ATTEMPTS"]``, and
    ``atomic`` None its ``OPTIONS["ATOMIC"]`` (see docs/atomic-handlers.md).
    ``concurrency``, ``rate``, ``burst`` and ``key`` limit its jobs per key across every
    worker, as eddyq's ``@task`` does (docs/flow-control.md).
    """

    max_attempts: int | None = None
    timeout: timedelta | None = None
    retention: Mapping[str, float | None] | None = None
    concurrency: int | None = None
    rate: str | None = None
    burst: int | None = None
    key: Callable[..., str | int] | None = None
    limits: Limits | None = dataclasses.field(default=None, init=False)
    atomic: bool | None = None

    def __post_init__(self) -> None:
        try:
            if self.max_attempts is not None:
                validate_positive_int(self.max_attempts, "max_attempts")
            if self.timeout is not None:
                object.__setattr__(self, "timeout", parse_duration(self.timeout, name="timeout"))
            if self.retention is not None:
                object.__setattr__(self, "retention", parse_retention(self.retention))
            limits = Limits.from_options(
                {"concurrency": self.concurrency, "rate": self.rate, "burst": self.burst}
            )
            object.__setattr__(self, "limits", limits or None)
            if self.key is not None and not limits:
                raise ValueError("a key is given but no limit: give concurrency= or rate= with it")
            if self.key is not None and not callable(self.key):
                raise TypeError("the key must be a function of the task's arguments")
        except (TypeError, ValueError) as error:
            raise InvalidTask(str(error)) from None
        # Not super(): a slotted dataclass is a new class, which super() without arguments
        # does not know.
        Task.__post_init__(self)
        try:
            handler = django_task_handler(self)
        except TypeError as error:  # atomic, and not a plain function
            raise InvalidTask(str(error)) from None
        # Declared, a Django task of this backend is one a worker may run (see registry).
        registry.declare(self.module_path, self, handler)

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | timedelta | None = None,
        backend: str | None = None,
        max_attempts: int | None = None,
        retention: Mapping[str, object] | None = None,
    ) -> EddyqTask:
        """A copy with these changed; ``run_after`` may also be a delay from the enqueue."""
        changes: dict[str, Any] = {}
        for name, value in (
            ("priority", priority),
            ("queue_name", queue_name),
            ("run_after", run_after),
            ("backend", backend),
            ("max_attempts", max_attempts),
            ("retention", retention),
        ):
            if value is not None:
                changes[name] = value
        return dataclasses.replace(self, **changes)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """This task with these arguments, as a workflow's step (``Workflow.add``)."""
        backend = self.get_backend()
        if not isinstance(backend, EddyqBackend):
            raise InvalidTask(f"task {self.module_path} is not of an eddyq backend")
        backend.validate_task(self)
        return signature_of(backend.job_spec(self, args, kwargs))


class EddyqBackend(BaseTaskBackend):
    """Django's Tasks on eddyq: jobs in PostgreSQL, in the caller's transaction.

    ``OPTIONS``: ``MAX_ATTEMPTS``, the attempts of a task that sets none (default 1: Django's
    tasks are not retried unless they ask); ``ATOMIC``, whether a task that does not say is
    atomic (default False).
    """

    task_class = EddyqTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        where = f"TASKS[{alias!r}]"
        if not isinstance(self.options, Mapping):
            raise InvalidTaskBackend(f'{where}["OPTIONS"] must be a dict, not {self.options!r}')
        for name in self.options:
            if name not in OPTIONS:
                hint = did_you_mean(str(name), OPTIONS)
                raise InvalidTaskBackend(f'{where}["OPTIONS"]: unknown option {name!r}. {hint}')
        try:
            self.max_attempts = validate_positive_int(
                self.options.get("MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS),
                f'{where}["OPTIONS"]["MAX_ATTEMPTS"]',
            )
            for queue in self.queues:
                validate_queue_name(queue)
        except ValueError as error:
            raise InvalidTaskBackend(f"{where}: {error}") from None
        self.atomic = self.options.get("ATOMIC", False)
        if type(self.atomic) is not bool:
            raise InvalidTaskBackend(
                f'{where}["OPTIONS"]["ATOMIC"] must be True or False, not {self.atomic!r}'
            )

    def validate_task(self, task: Task[..., Any]) -> None:
        """Django's checks, with ``run_after`` also a delay, and eddyq's queue names."""
        run_after: object = task.run_after
        if isinstance(run_after, timedelta):
            if not timedelta(0) <= run_after <= MAX_DELAY:
                raise InvalidTask(
                    f"run_after as a delay must be from 0 to {MAX_DELAY.days} days, "
                    f"not {run_after!r}"
                )
            # Django only checks that a datetime is aware; a delay needs no such check.
            task = _copy(task, run_after=None)
        super().validate_task(task)
        try:
            validate_queue_name(task.queue_name)
        except ValueError as error:
            raise InvalidTask(str(error)) from None

    # Enqueueing.

    def enqueue[**P, R](
        self, task: Task[P, R], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult[P, R]:
        """Store a job in the current transaction of the queue's database."""
        self.validate_task(task)
        job = insert_jobs([self.job_spec(task, args, kwargs)])[0]
        result = self._enqueued(task, job)
        task_enqueued.send(type(self), task_result=result)
        return result

    async def aenqueue[**P, R](
        self, task: Task[P, R], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult[P, R]:
        """``enqueue`` from async code, on the connection of Django's async ORM calls.

        The insert runs through ``sync_to_async(thread_sensitive=True)``, as the async ORM's
        queries do: the job joins whatever that thread's connection is doing, a transaction
        included. The signal is sent with ``asend``, so async receivers run on the event loop.
        """
        self.validate_task(task)
        spec = self.job_spec(task, args, kwargs)
        jobs = await sync_to_async(insert_jobs, thread_sensitive=True)([spec])
        result = self._enqueued(task, jobs[0])
        await task_enqueued.asend(type(self), task_result=result)
        return result

    def job_spec(
        self, task: Task[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> JobSpec:
        normal_args, normal_kwargs = normalize_arguments(args, kwargs)
        run_at, delay = due_time(task.run_after)
        max_attempts = getattr(task, "max_attempts", None)
        retention = getattr(task, "retention", None)
        job_limit_key = None
        if getattr(task, "limits", None) is not None:
            key = getattr(task, "key", None)
            job_limit_key = (
                WHOLE_TASK_KEY
                if key is None
                else key_of(
                    key,
                    key_signature(task.func, takes_context=task.takes_context),
                    task.module_path,
                    normal_args,
                    normal_kwargs,
                )
            )
        return JobSpec(
            task=task.module_path,
            args=normal_args,
            kwargs=normal_kwargs,
            queue=task.queue_name,
            priority=task.priority,
            max_attempts=self.max_attempts if max_attempts is None else max_attempts,
            run_at=run_at,
            delay=delay,
            retention=None if retention is None else dict(retention),
            metadata={BACKEND_METADATA_KEY: self.alias},
            batch_id=current_batch.get(),
            limit_key=job_limit_key,
        )

    def _enqueued[**P, R](self, task: Task[P, R], job: Job) -> TaskResult[P, R]:
        if isinstance(task.run_after, timedelta):
            # The delay became a time when the database added it to its clock.
            task = _copy(task, run_after=job.run_at)
        return result_from_job(task, job, self.alias)

    # Results.

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """The result of the job with this id, as it is stored now."""
        job = Job.objects.filter(pk=_job_id(result_id)).first()
        if job is None:
            raise TaskResultDoesNotExist(f"no task result with id {result_id!r}")
        return self._result(job)

    async def aget_result(self, result_id: str) -> TaskResult[..., Any]:
        job = await Job.objects.filter(pk=_job_id(result_id)).afirst()
        if job is None:
            raise TaskResultDoesNotExist(f"no task result with id {result_id!r}")
        return self._result(job)

    def _result(self, job: Job) -> TaskResult[..., Any]:
        try:
            target = registry.lookup(job.task).task
        except TaskNotFound as error:
            raise TaskResultDoesNotExist(f"task result {job.pk} exists, but {error}") from error
        source: Task[..., Any] | None
        if isinstance(target, Task):
            source, func = target, target.func
        else:
            # A job of eddyq's own @task: the same table, seen through Django's API.
            assert isinstance(target, EddyqOwnTask)
            source, func = None, target.func
        values: dict[str, Any] = {"queue_name": job.queue, "priority": job.priority}
        if source is None:
            # Django 6.0's Task has no defaults for these.
            values |= {"run_after": None, "takes_context": False}
        task = _build(
            type(source) if source is not None else self.task_class,
            source,
            func=func,
            backend=self.alias,
            **values,
        )
        return result_from_job(task, job, self.alias)


def result_from_job[**P, R](task: Task[P, R], job: Job, alias: str) -> TaskResult[P, R]:
    """The ``TaskResult`` a stored job amounts to.

    - ``id``: the job's id, as a string.
    - ``status``: scheduled, available and retryable are READY; running is RUNNING; completed
      is SUCCESSFUL; failed and cancelled are FAILED.
    - ``enqueued_at`` is ``created_at``; ``finished_at`` is ``finalized_at``. A job keeps the
      start of its latest attempt only, ``attempted_at``: it is both ``started_at`` and
      ``last_attempted_at`` (each failed attempt's end is in the job's ``errors``).
    - ``errors``: a ``TaskError`` per failed attempt, oldest first.
    - ``worker_ids``: one per attempt, so that ``attempts`` is the job's ``attempt``; see
      ``_worker_ids``.
    - ``return_value``: the job's ``result``, once SUCCESSFUL.
    """
    status = STATUS_OF_STATE[job.state]
    result: TaskResult[P, R] = TaskResult(
        task=task,
        id=str(job.pk),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.attempted_at,
        last_attempted_at=job.attempted_at,
        finished_at=job.finalized_at,
        args=list(job.args),
        kwargs=dict(job.kwargs),
        backend=alias,
        errors=[_task_error(entry) for entry in job.errors],
        worker_ids=_worker_ids(job),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _worker_ids(job: Job) -> list[str]:
    """One worker id per attempt, from what the job keeps.

    A job keeps the worker of its latest attempt (``attempted_by``), and each failed attempt
    ended with an error entry naming its worker (``"worker"``, or ``"rescued_from"`` for the
    worker whose lease the rescuer found expired). An attempt whose worker is not known (a job
    of a version that did not record it) is ``""``.
    """
    workers: dict[int, str] = {}
    latest = job.attempted_by or job.locked_by
    if latest:
        workers[job.attempt] = latest
    for entry in job.errors if isinstance(job.errors, list) else []:
        attempt = entry.get("attempt") if isinstance(entry, dict) else None
        worker = entry.get("worker") or entry.get("rescued_from") if attempt else None
        if isinstance(attempt, int) and isinstance(worker, str):
            workers[attempt] = worker
    return [workers.get(attempt, "") for attempt in range(1, job.attempt + 1)]


def _task_error(entry: Mapping[str, Any]) -> TaskError:
    return TaskError(
        exception_class_path=str(entry.get("exception_class") or "builtins.Exception"),
        # The rescuer has no traceback to give; its message says what happened.
        traceback=str(entry.get("traceback") or entry.get("error") or ""),
    )


# The worker's side: how a job of a Django task runs.


def django_task_handler(task: Task[..., Any]) -> Handler:
    """The handler of a Django task found at a job's path (see ``handlers.resolve``)."""
    timeout: object = getattr(task, "timeout", None)
    atomic = getattr(task, "atomic", None)
    if atomic is None:
        backend = task.get_backend()
        atomic = isinstance(backend, EddyqBackend) and backend.atomic
    return Handler(
        func=task.func,
        timeout=timeout.total_seconds() if isinstance(timeout, timedelta) else None,
        backoff=None,
        hooks=DjangoTaskHooks(task),
        limits=getattr(task, "limits", None),
        atomic=atomic,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class DjangoTaskHooks:
    """Around each attempt: a ``TaskResult`` read from the job, the context, the signals."""

    task: Task[..., Any]

    def begin(self, job: ClaimedJob) -> DjangoTaskAttempt:
        attempt = self._attempt(job, Job.all_objects.filter(pk=job.id).first())
        task_started.send(attempt.sender, task_result=attempt.result)
        return attempt

    async def abegin(self, job: ClaimedJob) -> DjangoTaskAttempt:
        attempt = self._attempt(job, await Job.all_objects.filter(pk=job.id).afirst())
        await task_started.asend(attempt.sender, task_result=attempt.result)
        return attempt

    def _attempt(self, job: ClaimedJob, row: Job | None) -> DjangoTaskAttempt:
        if row is None:
            # Deleted since the claim: nothing will store this attempt's outcome either.
            raise RuntimeError(f"eddyq job {job.id} no longer exists")
        alias = str(job.metadata.get(BACKEND_METADATA_KEY, self.task.backend))
        task = _build(
            type(self.task),
            self.task,
            queue_name=job.queue,
            priority=job.priority,
            backend=alias,
        )
        result = result_from_job(task, row, alias)
        # This attempt is running, whatever happened to the row since the claim.
        object.__setattr__(result, "status", TaskResultStatus.RUNNING)
        args: Sequence[Any] = job.args
        if self.task.takes_context:
            args = (TaskContext(task_result=result), *job.args)
        return DjangoTaskAttempt(args, job.kwargs, result, _backend_class(alias), row.locked_by)


@dataclasses.dataclass(slots=True)
class DjangoTaskAttempt:
    """One attempt of a Django task: its arguments (the context first if the task takes it)
    and the ``TaskResult`` that its signals carry and its context shows."""

    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    result: TaskResult[..., Any]
    sender: type[BaseTaskBackend]
    worker_id: str | None

    def end(self, outcome: Outcome) -> None:
        self._record(outcome)
        task_finished.send(self.sender, task_result=self.result)

    async def aend(self, outcome: Outcome) -> None:
        self._record(outcome)
        await task_finished.asend(self.sender, task_result=self.result)

    def _record(self, outcome: Outcome) -> None:
        """The result as the job will be stored; a failure's error entry gets the worker."""
        result = self.result
        if outcome.error is not None:
            if self.worker_id:
                outcome.error.setdefault("worker", self.worker_id)
            result.errors.append(_task_error(outcome.error))
        if outcome.attempt_given_back:  # snoozed: the attempt does not count
            del result.worker_ids[-outcome.attempt_given_back :]
        status = STATUS_OF_STATE[outcome.state]
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", outcome.result)
        if outcome.state in TERMINAL_STATES:
            object.__setattr__(result, "finished_at", timezone.now())
        object.__setattr__(result, "status", status)


# Helpers.


def _job_id(result_id: object) -> int:
    text = str(result_id)
    if not _RESULT_ID.fullmatch(text) or int(text) > _BIGINT_MAX:
        raise TaskResultDoesNotExist(f"no task result with id {result_id!r}")
    return int(text)


def _backend_class(alias: str) -> type[BaseTaskBackend]:
    """The sender of the signals: the class of the backend the task was enqueued through."""
    try:
        return type(task_backends[alias])
    except InvalidTaskBackend:
        return EddyqBackend


def _copy[T: Task[..., Any]](task: T, **changes: Any) -> T:
    return _build(type(task), task, **changes)


def _build[T: Task[..., Any]](cls: type[T], source: Task[..., Any] | None, **values: Any) -> T:
    """A task of ``cls`` from ``values``, then ``source``'s fields, then the defaults.

    Built without the backend's validation, which ``Task`` runs when it is made: a stored job
    was validated when it was enqueued, and its queue may be one the settings no longer allow.
    """
    task = object.__new__(cls)
    for field in dataclasses.fields(cls):
        if field.name in values:
            value = values[field.name]
        elif source is not None and hasattr(source, field.name):
            value = getattr(source, field.name)
        elif field.default is not dataclasses.MISSING:
            value = field.default
        else:
            raise TypeError(f"{cls.__name__} needs {field.name!r}")
        object.__setattr__(task, field.name, value)
    return task
