"""Running one job's handler and turning what happened into an outcome to store."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections, transaction

from django_eddyq import sql
from django_eddyq.arguments import dumps, load_arguments, loads, normalize_json, storable_text
from django_eddyq.conf import eddyq_settings
from django_eddyq.current import CancelFlag
from django_eddyq.durations import delay_seconds
from django_eddyq.exceptions import (
    CompletionRefused,
    Discard,
    MalformedJob,
    OutcomeNotStored,
    Snooze,
)
from django_eddyq.handlers import Attempt, Handler, retry_delay
from django_eddyq.operations import complete_batches

logger = logging.getLogger(__name__)


# What an error entry keeps of a message and of a traceback, in characters.
ERROR_TEXT_LIMIT = 10_000
TRACEBACK_LIMIT = 100_000


@dataclasses.dataclass(slots=True)
class ClaimedJob:
    """A job this worker holds the lease of, as the claim returned it.

    ``problem`` says why the row cannot run (its JSON unreadable, or of the wrong kind); such a
    job fails as soon as it is claimed, without reaching a handler.
    """

    id: int
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str
    priority: int
    due: float  # run_at, in seconds since the epoch (infinite for a row that says so)
    attempt: int
    max_attempts: int
    batch_id: int | None
    metadata: dict[str, Any]
    enqueued: float  # created_at, in seconds since the epoch
    problem: str | None = None


JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def claimed_job(row: Sequence[Any]) -> ClaimedJob:
    """A row of the claim as a job. Its JSON columns come as text and are read here, each row
    on its own: a row that cannot be read fails its own job, never the claim that took it."""
    (
        job_id,
        task,
        args,
        kwargs,
        queue,
        priority,
        due,
        attempt,
        max_attempts,
        batch,
        metadata,
        enqueued,
    ) = row
    try:
        parsed = load_arguments(args), load_arguments(kwargs), loads(metadata)
    except Exception:  # bad JSON, an integer of too many digits, deep nesting: see which
        parsed = None
    if parsed is not None:
        parsed_args, parsed_kwargs, parsed_metadata = parsed
        if (
            type(parsed_args) is list
            and type(parsed_kwargs) is dict
            and type(parsed_metadata) is dict
        ):
            return ClaimedJob(
                job_id,
                task,
                parsed_args,
                parsed_kwargs,
                queue,
                priority,
                due,
                attempt,
                max_attempts,
                batch,
                parsed_metadata,
                enqueued,
            )
    job = ClaimedJob(
        job_id, task, [], {}, queue, priority, due, attempt, max_attempts, batch, {}, enqueued
    )
    job.problem = _problem(
        job_id,
        (
            ("args", args, list, load_arguments),
            ("kwargs", kwargs, dict, load_arguments),
            ("metadata", metadata, dict, loads),
        ),
    )
    return job


def _problem(job_id: int, columns: Sequence[tuple[str, str, type, Callable[[str], Any]]]) -> str:
    """What is wrong with the first of ``columns`` (name, JSON text, wanted type, reader)."""
    for column, text, wanted, read in columns:
        try:
            value = read(text)
        except Exception as error:
            return f"the stored {column} of job {job_id} cannot be read: {error!r}"
        if type(value) is not wanted:
            found = "null" if value is None else JSON_TYPES.get(type(value), "a number")
            return (
                f"the stored {column} of job {job_id} are malformed: {found}, not "
                f"{JSON_TYPES[wanted]}"
            )
    raise AssertionError("no column is wrong")


@dataclasses.dataclass(slots=True)
class Outcome:
    """How an attempt ended: the row values one fenced statement writes for it, and (never
    stored) what the handler raised and how long it ran, for logs, signals and metrics."""

    job: ClaimedJob
    state: str
    result: Any = None
    error: dict[str, Any] | None = None
    delay: float | None = None
    attempt_given_back: int = 0
    exception: BaseException | None = None
    duration: float | None = None  # seconds the handler ran; None if it never started
    # Stored already, by the atomic handler's own transaction: no pass writes it again.
    committed: bool = False

    @property
    def summary(self) -> str:
        if self.error is not None:
            return str(self.error["error"])
        return self.state

    @property
    def kind(self) -> str:
        """What became of the attempt, as ``signals.OUTCOMES`` names it."""
        if self.state == "failed" and isinstance(self.exception, Discard):
            return "discarded"
        return _KINDS[self.state]


_KINDS = {
    "completed": "completed",
    "retryable": "retried",
    "scheduled": "snoozed",
    "failed": "failed",
    "cancelled": "cancelled",
    "available": "handed back",
}


@dataclasses.dataclass(slots=True, eq=False)
class RunningJob:
    """A claimed job whose handler was started; the worker's main-thread bookkeeping."""

    job: ClaimedJob
    handler: Handler | None
    deadline: float | None  # time.monotonic() after which the attempt has timed out
    settled: bool = False  # its outcome is already decided (timed out, lost): ignore a late one
    cancel: CancelFlag = dataclasses.field(default_factory=CancelFlag)
    future: Future[Outcome] | None = None  # an async handler's result
    task: asyncio.Task[Outcome] | None = None  # an async handler's task, to cancel it
    stuck_logged: bool = False  # still running past its timeout and the grace: said once
    queued_at: float = dataclasses.field(default_factory=time.monotonic)
    started_at: float | None = None  # time.monotonic() when a handler thread started it
    interrupted: bool = False  # cancelled by the worker's own stop: handed back once it ends
    committing: bool = False  # an atomic handler returned: its transaction writes the outcome

    def seconds_over(self, now: float) -> float:
        """How long it has run past its timeout (0 without one)."""
        return 0.0 if self.deadline is None else now - self.deadline


def outcome_records(outcomes: Sequence[Outcome]) -> str:
    """The outcomes as the JSON array ``sql.FINISH_JOBS`` reads, its empty fields left out."""
    records = []
    for outcome in outcomes:
        record: dict[str, Any] = {
            "id": outcome.job.id,
            "attempt": outcome.job.attempt,
            "state": outcome.state,
        }
        if outcome.result is not None:
            record["result"] = outcome.result
        if outcome.error is not None:
            record["error"] = outcome.error
        if outcome.delay is not None:
            record["delay"] = outcome.delay
        if outcome.attempt_given_back:
            record["attempt_given_back"] = outcome.attempt_given_back
        records.append(record)
    return dumps(records)


def error_entry(job: ClaimedJob, error: BaseException) -> dict[str, Any]:
    """The error entry of an attempt that ended with ``error``: whatever the exception holds
    (a message that fails to render, NUL, megabytes), text the jobs table can store."""
    kind = type(error)
    try:
        message = str(error)
    except Exception:
        message = f"<str() of the {kind.__name__} raised>"
    try:
        trace = "".join(traceback.format_exception(error))
    except Exception:
        trace = ""
    return {
        "attempt": job.attempt,
        "error": storable_text(f"{kind.__name__}: {message}", ERROR_TEXT_LIMIT),
        "exception_class": storable_text(f"{kind.__module__}.{kind.__qualname__}", 1_000),
        "traceback": storable_text(trace, TRACEBACK_LIMIT),
    }


def failure(job: ClaimedJob, handler: Handler | None, error: BaseException) -> Outcome:
    """A failed attempt: retryable after the backoff, or failed once attempts are used up."""
    entry = error_entry(job, error)
    if job.attempt >= job.max_attempts:
        return Outcome(job, "failed", error=entry, exception=error)
    return Outcome(
        job, "retryable", error=entry, delay=retry_delay(handler, job.attempt), exception=error
    )


def timed_out(job: ClaimedJob, handler: Handler) -> Outcome:
    error = TimeoutError(f"task {job.task} ran longer than its timeout of {handler.timeout:g}s")
    return failure(job, handler, error)


def cancelled(outcome: Outcome) -> Outcome:
    """The job was cancelled while running and its handler did not complete: it ends here."""
    return Outcome(
        outcome.job,
        "cancelled",
        error=outcome.error,
        exception=outcome.exception,
        duration=outcome.duration,
    )


def returned(job: ClaimedJob) -> Outcome:
    """Handed back unstarted (or interrupted by the worker itself): available again, the
    attempt not counted."""
    return Outcome(job, "available", attempt_given_back=1)


def malformed(job: ClaimedJob) -> Outcome:
    """A row that cannot run (``job.problem``) fails for good: another attempt would read the
    same row again."""
    problem = MalformedJob(job.problem)
    return Outcome(job, "failed", error=error_entry(job, problem), exception=problem)


def not_stored(outcome: Outcome, error: BaseException) -> Outcome:
    """What replaces an outcome the database refused: the job fails for good, saying why."""
    refused = OutcomeNotStored(
        f"the outcome of attempt {outcome.job.attempt} ({outcome.state}) could not be stored: "
        f"{type(error).__name__}: {error}"
    )
    return Outcome(
        outcome.job,
        "failed",
        error=error_entry(outcome.job, refused),
        exception=refused,
        duration=outcome.duration,
    )


def _settle(job: ClaimedJob, handler: Handler, value: Any) -> Outcome:
    try:
        result = normalize_json(value, where=f"the return value of {job.task}")
    except TypeError as error:
        return failure(job, handler, error)
    return Outcome(job, "completed", result=result)


def _steer(job: ClaimedJob, handler: Handler | None, error: BaseException) -> Outcome:
    if isinstance(error, Snooze):
        try:
            # Checked again: a subclass of Snooze may set its delay without its checks.
            delay = delay_seconds(error.seconds, name="Snooze")
        except Exception as invalid:
            return failure(job, handler, invalid)
        return Outcome(job, "scheduled", delay=delay, attempt_given_back=1, exception=error)
    if isinstance(error, Discard):
        return Outcome(job, "failed", error=error_entry(job, error), exception=error)
    return failure(job, handler, error)


def run_sync(job: ClaimedJob, handler: Handler, connections_checked: bool = False) -> Outcome:
    """Run a sync handler on this thread, with Django's connection-age handling around it
    (before it only if this thread's connections were not ``connections_checked`` just now).

    Whatever the handler raises, even a ``BaseException``, ends as an outcome: a handler
    thread must outlive every job, or its job would stay running under renewed leases.
    """
    try:
        if not connections_checked:
            close_old_connections()
        return attempt(job, handler)
    except BaseException as error:
        return _steer(job, handler, error)
    finally:
        close_old_connections()


def attempt(job: ClaimedJob, handler: Handler) -> Outcome:
    """One attempt of a sync handler, here and now, with nothing around it (the worker adds
    Django's connection handling; ``testing.run_jobs`` runs it in the test's transaction)."""
    try:
        if handler.hooks is not None:
            return _run_hooked(job, handler, handler.hooks.begin(job))
        value = handler.func(*job.args, **job.kwargs)
        return _settle(job, handler, value)
    except BaseException as error:
        return _steer(job, handler, error)


def run_atomic(
    running: RunningJob,
    handler: Handler,
    *,
    worker_id: str,
    source: str,
    connections_checked: bool = False,
) -> Outcome:
    """Run an atomic handler on this thread, in a transaction on the queue's database that
    writes the job's completion too, fenced as a pass would write it (this worker, this
    attempt) and also by a cancel: the handler's writes commit with the completion, or not at
    all. ``source`` is the activity row the completion is counted into.

    An attempt that does not complete (it raised, snoozed, discarded itself) is rolled back
    and its outcome returned for a pass to write, as a plain handler's is; so is one whose
    fence refused it (see ``refused``). The outcome of one that committed is ``committed``.
    """
    job = running.job
    try:
        if not connections_checked:
            close_old_connections()
        return _attempt_atomic(running, handler, worker_id, source)
    except BaseException as error:
        # The transaction failed to finish or to commit (a query the handler left failing,
        # a deferred constraint, the connection): nothing of it was stored.
        return _steer(job, handler, error)
    finally:
        close_old_connections()


def _attempt_atomic(running: RunningJob, handler: Handler, worker_id: str, source: str) -> Outcome:
    job = running.job
    alias = eddyq_settings.DATABASE
    try:
        with transaction.atomic(using=alias):
            outcome = attempt(job, handler)
            if outcome.state != "completed":
                raise _RolledBack(outcome)
            # From here a lease that seems lost may be this commit's doing (see Slots.lost).
            running.committing = True
            with connections[alias].cursor() as cursor:
                cursor.execute(
                    sql.FINISH_ATOMIC_JOB,
                    {
                        "worker_id": worker_id,
                        "source": source,
                        "outcomes": outcome_records([outcome]),
                    },
                )
                if cursor.fetchone() is None:
                    raise _RolledBack(refused(outcome))
                if job.batch_id is not None:
                    complete_batches(cursor, [job.batch_id])
    except _RolledBack as rolled_back:
        return rolled_back.outcome
    outcome.committed = True
    return outcome


class _RolledBack(Exception):
    """Leaves an atomic handler's transaction, rolling it back, with the attempt's outcome."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


def refused(outcome: Outcome) -> Outcome:
    """An atomic attempt that completed, but whose fence refused its completion: the job was
    cancelled meanwhile, and ends so; or it is no longer this worker's, and the pass's fence
    discards this outcome too."""
    job = outcome.job
    error = CompletionRefused(
        f"attempt {job.attempt} completed, but the job was cancelled or its lease lost before "
        "it could commit: what it wrote was rolled back"
    )
    logger.info("eddyq job %s (%s): %s", job.id, job.task, error)
    return Outcome(job, "cancelled", error=error_entry(job, error), exception=error)


async def run_async(job: ClaimedJob, handler: Handler) -> Outcome:
    """Run an async handler on the worker's event loop; its timeout cancels it.

    Django's connection-age handling runs around it too, in the thread where the ORM's async
    methods run their queries.
    """
    try:
        await sync_to_async(close_old_connections)()
        return await attempt_async(job, handler)
    except Exception as error:
        return _steer(job, handler, error)
    finally:
        await sync_to_async(close_old_connections)()


async def attempt_async(job: ClaimedJob, handler: Handler) -> Outcome:
    """One attempt of an async handler, with nothing around it: see ``attempt``."""
    deadline = asyncio.timeout(handler.timeout)
    try:
        if handler.hooks is not None:
            hooked = await handler.hooks.abegin(job)
            outcome = await _call_async(job, handler, deadline, hooked.args, hooked.kwargs)
            await _end_async(job, hooked, outcome)
            return outcome
        return await _call_async(job, handler, deadline, job.args, job.kwargs)
    except Exception as error:
        return _steer(job, handler, error)


async def _call_async(
    job: ClaimedJob,
    handler: Handler,
    deadline: asyncio.Timeout,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Outcome:
    try:
        async with deadline:
            value = await handler.func(*args, **kwargs)
        return _settle(job, handler, value)
    except TimeoutError as error:
        if deadline.expired():
            return timed_out(job, handler)
        return _steer(job, handler, error)
    except Exception as error:
        return _steer(job, handler, error)


# Hooked handlers (Django's tasks): the hooks make the call's arguments and hear its outcome.


def _run_hooked(job: ClaimedJob, handler: Handler, attempt: Attempt) -> Outcome:
    try:
        value = handler.func(*attempt.args, **attempt.kwargs)
        outcome = _settle(job, handler, value)
    except BaseException as error:
        outcome = _steer(job, handler, error)
    try:
        attempt.end(outcome)
    except Exception:
        logger.exception("eddyq job %s (%s): ending its attempt failed", job.id, job.task)
    return outcome


async def _end_async(job: ClaimedJob, attempt: Attempt, outcome: Outcome) -> None:
    try:
        await attempt.aend(outcome)
    except Exception:
        logger.exception("eddyq job %s (%s): ending its attempt failed", job.id, job.task)
