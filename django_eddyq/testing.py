"""Testing your own code: jobs run in your test's process, and assertions on what was enqueued.

* ``run_jobs()`` runs the due jobs here and now, on Django's connection, inside your test's
  transaction: a plain ``TestCase`` (or ``@pytest.mark.django_db``) test needs neither
  ``transaction=True`` nor a worker process. Each job gets one attempt per call, recorded as a
  worker records it: completed, retryable after its back-off, snoozed, failed.
* ``eager()``: jobs run in this process as the transaction that enqueued them commits, like
  Django's ``ImmediateBackend`` or Celery's eager mode. In a ``TestCase``, whose transaction
  never commits, use ``captureOnCommitCallbacks(execute=True)``.
* ``enqueued()``, ``assert_enqueued()``, ``assert_not_enqueued()``: what is waiting to run.
  ``EddyqTestMixin`` gives ``TestCase`` the same as methods; with pytest, the plugin
  ``django_eddyq.pytest_plugin`` (loaded by itself once django-eddyq is installed) gives the
  fixtures ``run_jobs`` and ``eddyq_eager``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.db import DatabaseError, connections, transaction

from django_eddyq import current, registry, signals, sql
from django_eddyq.arguments import normalize_json
from django_eddyq.conf import eddyq_settings
from django_eddyq.current import CancelFlag
from django_eddyq.exceptions import TaskNotFound
from django_eddyq.models import Job
from django_eddyq.tasks import Task
from django_eddyq.vocabulary import UNFINISHED_STATES
from django_eddyq.worker.execution import (
    ClaimedJob,
    Outcome,
    attempt,
    attempt_async,
    failure,
    malformed,
    returned,
)
from django_eddyq.worker.passes import KeyedTasks, Pass, run_pass

# How many jobs a round of run_jobs() claims at once, and how many rounds it runs at most (a
# task that always enqueues another would run forever).
ROUND = 100
MAX_ROUNDS = 1000


def testing_worker_id() -> str:
    """The worker id that jobs run by ``run_jobs`` record."""
    return f"testing:{os.getpid()}"


def run_jobs(
    *, queues: Sequence[str] | None = None, now: datetime | None = None, ids: Sequence[int] = ()
) -> list[Job]:
    """Run the due jobs in this process, each once, and return them as they ended.

    Jobs due at ``now`` (the database's clock by default; pass a later time to run jobs
    scheduled or retryable until then) are made available, claimed, run with their registered
    handler, and their outcomes stored, all on Django's connection to the queue's database, so
    in the caller's transaction. Jobs that the handlers enqueue run too; a job that is due again
    at once (a retry without back-off, a snooze of zero) runs again only at the next call.
    ``ids`` limits it to those jobs.
    """
    alias = eddyq_settings.DATABASE
    connection = connections[alias]
    connection.ensure_connection()
    ran: set[int] = set()
    with transaction.atomic(using=alias):
        _promote_due(now, queues)
        for _round in range(MAX_ROUNDS):
            claimed = _pass(Pass(outcomes=[], renew=[], promote=False, claim=ROUND, touch=[]))
            ready = [job for job in claimed if job.id not in ran and (not ids or job.id in ids)]
            # The others go back untouched, their attempt given back.
            outcomes = [_run(job) if job in ready else returned(job) for job in claimed]
            _pass(Pass(outcomes=outcomes, renew=[], promote=False, claim=0, touch=[]))
            for outcome in outcomes:
                if outcome.job in ready:
                    signals.send(
                        signals.job_finished,
                        Job,
                        job=outcome.job,
                        outcome=outcome.kind,
                        duration=outcome.duration,
                        exception=outcome.exception,
                        worker_id=testing_worker_id(),
                    )
            if not ready:
                break
            ran.update(job.id for job in ready)
        else:
            raise RuntimeError(f"run_jobs(): jobs kept coming for {MAX_ROUNDS} rounds")
    return list(Job.all_objects.using(alias).filter(pk__in=ran).order_by("pk"))


def _pass(planned: Pass) -> list[ClaimedJob]:
    """Run ``planned`` on Django's connection to the queue's database; what it claimed. Its
    claim keeps to the flow-control limits as a worker's does: a job of a limited queue or key
    runs when its limit has room, in this round or a later one."""
    connection = connections[eddyq_settings.DATABASE].connection
    limited = [name for (name,) in connection.execute(sql.LIMITED_QUEUES).fetchall()]
    return run_pass(
        connection,
        planned,
        worker_id=testing_worker_id(),
        lease_seconds=eddyq_settings.STALE_AFTER.total_seconds(),
        queues=None,
        limited=limited,
        keyed=KeyedTasks.declared(),
    ).claimed


def _promote_due(now: datetime | None, queues: Sequence[str] | None) -> None:
    with connections[eddyq_settings.DATABASE].cursor() as cursor:
        statement, params = (
            (sql.PROMOTE_DUE_FROM_QUEUES, {"queues": list(queues)})
            if queues
            else (sql.PROMOTE_DUE_ANY_QUEUE, {})
        )
        while True:
            cursor.execute(statement, {**params, "now": now, "limit": 1000})
            if int(cursor.fetchone()[0]) < 1000:
                return


def _run(job: ClaimedJob) -> Outcome:
    """One attempt of ``job``, here, as a worker's handler thread would run it."""
    if job.problem is not None:
        return malformed(job)
    try:
        handler = registry.handler(job.task)
    except TaskNotFound as error:
        return failure(job, None, error)
    signals.send(signals.job_started, Job, job=job, worker_id=testing_worker_id())
    # A handler whose query failed leaves the test's transaction aborted: its savepoint goes;
    # so does the work of an atomic handler that did not complete, as a worker rolls it back.
    outcome: Outcome | None = None
    token = current.enter(job, CancelFlag())
    try:
        with transaction.atomic(using=eddyq_settings.DATABASE):
            if handler.is_async:
                outcome = async_to_sync(attempt_async)(job, handler)
            else:
                outcome = attempt(job, handler)
            if isinstance(outcome.exception, DatabaseError) or (
                handler.atomic and outcome.state != "completed"
            ):
                raise _RollBack
    except _RollBack:
        pass
    finally:
        current.leave(token)
    assert outcome is not None
    return outcome


class _RollBack(Exception):
    """Leaves the atomic block of a handler, rolling its savepoint back."""


# Eager mode.


@contextmanager
def eager() -> Iterator[None]:
    """Within the block, each job enqueued runs in this process, once, as the transaction that
    enqueued it commits (at once in autocommit)."""
    signals.job_enqueued.connect(_run_on_commit, weak=False, dispatch_uid=_EAGER)
    try:
        yield
    finally:
        signals.job_enqueued.disconnect(dispatch_uid=_EAGER)


_EAGER = "django_eddyq.testing.eager"


def _run_on_commit(sender: Any, jobs: Sequence[Job], **kwargs: Any) -> None:
    ids = [job.pk for job in jobs]
    transaction.on_commit(lambda: run_jobs(ids=ids), using=eddyq_settings.DATABASE)


# What was enqueued.


def enqueued(task: Task[..., Any] | str | None = None, **filters: Any) -> list[Job]:
    """The jobs waiting to run (scheduled, available, retryable, running), oldest first; of
    ``task`` (a task or its path) when given, and matching Django ``filters`` on ``Job``."""
    jobs = Job.objects.filter(state__in=UNFINISHED_STATES, **filters)
    if task is not None:
        jobs = jobs.filter(task=task if isinstance(task, str) else task.path)
    return list(jobs.order_by("pk"))


def assert_enqueued(
    task: Task[..., Any] | str,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: datetime | None = None,
    run_at_within: timedelta = timedelta(seconds=1),
    count: int | None = None,
) -> list[Job]:
    """Assert that jobs of ``task`` wait to run with these arguments and options (each given
    one must match; ``run_at`` within ``run_at_within``), ``count`` of them if given, at least
    one otherwise; return them. The message lists what was enqueued instead."""
    path = task if isinstance(task, str) else task.path
    candidates = enqueued(path)
    matching = [
        job
        for job in candidates
        if (args is None or job.args == _stored(list(args)))
        and (kwargs is None or job.kwargs == _stored(dict(kwargs)))
        and (queue is None or job.queue == queue)
        and (priority is None or job.priority == priority)
        and (run_at is None or abs(job.run_at - run_at) <= run_at_within)
    ]
    wanted = f"{count} job(s)" if count is not None else "a job"
    if (count is None and not matching) or (count is not None and len(matching) != count):
        described = "\n".join(
            f"  {job.task}(*{job.args!r}, **{job.kwargs!r}) queue={job.queue} "
            f"priority={job.priority} run_at={job.run_at:%Y-%m-%d %H:%M:%S}"
            for job in candidates
        )
        raise AssertionError(
            f"expected {wanted} of {path} with args={args!r} kwargs={kwargs!r} queue={queue!r} "
            f"priority={priority!r} run_at={run_at!r}; found {len(matching)}. Enqueued:\n"
            + (described or "  nothing")
        )
    return matching


def assert_not_enqueued(task: Task[..., Any] | str) -> None:
    path = task if isinstance(task, str) else task.path
    found = enqueued(path)
    if found:
        raise AssertionError(f"expected no job of {path}; found {len(found)}: {found}")


def _stored(value: Any) -> Any:
    """``value`` as it is stored, tuples as lists and other types tagged, for comparing."""
    return normalize_json(value, where="the expected arguments")


class EddyqTestMixin:
    """For ``TestCase``: ``self.run_jobs()``, ``self.assertEnqueued(...)``,
    ``self.assertNotEnqueued(...)``, ``self.enqueued(...)``."""

    def run_jobs(self, **options: Any) -> list[Job]:
        return run_jobs(**options)

    def enqueued(self, task: Task[..., Any] | str | None = None, **filters: Any) -> list[Job]:
        return enqueued(task, **filters)

    def assertEnqueued(self, task: Task[..., Any] | str, *args: Any, **options: Any) -> list[Job]:
        return assert_enqueued(task, *args, **options)

    def assertNotEnqueued(self, task: Task[..., Any] | str) -> None:
        assert_not_enqueued(task)
