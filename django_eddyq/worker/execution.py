"""Running one job's handler and turning what happened into an outcome to store."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import traceback
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from django_eddyq.arguments import dumps, normalize_json
from django_eddyq.exceptions import Discard, MalformedJob, Snooze
from django_eddyq.handlers import Attempt, Handler, retry_delay

logger = logging.getLogger("django_eddyq")


@dataclasses.dataclass(slots=True)
class ClaimedJob:
    """A job this worker holds the lease of, as the claim returned it."""

    id: int
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str
    priority: int
    run_at: datetime
    attempt: int
    max_attempts: int
    attempted_at: datetime
    batch_id: int | None
    metadata: dict[str, Any]


@dataclasses.dataclass(slots=True)
class Outcome:
    """How an attempt ended: the row values one fenced statement writes for it."""

    job: ClaimedJob
    state: str
    result: Any = None
    error: dict[str, Any] | None = None
    delay: float | None = None
    attempt_given_back: int = 0

    @property
    def summary(self) -> str:
        if self.error is not None:
            return str(self.error["error"])
        return self.state


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
    kind = type(error)
    return {
        "attempt": job.attempt,
        "error": f"{kind.__name__}: {error}",
        "exception_class": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(traceback.format_exception(error)),
    }


def failure(job: ClaimedJob, handler: Handler | None, error: BaseException) -> Outcome:
    """A failed attempt: retryable after the backoff, or failed once attempts are used up."""
    entry = error_entry(job, error)
    if job.attempt >= job.max_attempts:
        return Outcome(job, "failed", error=entry)
    return Outcome(job, "retryable", error=entry, delay=retry_delay(handler, job.attempt))


def timed_out(job: ClaimedJob, handler: Handler) -> Outcome:
    error = TimeoutError(f"task {job.task} ran longer than its timeout of {handler.timeout:g}s")
    return failure(job, handler, error)


def cancelled(outcome: Outcome) -> Outcome:
    """The job was cancelled while running and its handler did not complete: it ends here."""
    return Outcome(outcome.job, "cancelled", error=outcome.error)


def returned(job: ClaimedJob) -> Outcome:
    """Handed back unfinished at shutdown: available again, the attempt not counted."""
    return Outcome(job, "available", attempt_given_back=1)


JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def check_stored_arguments(job: ClaimedJob) -> None:
    """Raise ``MalformedJob`` if the row's args are not a JSON array or its kwargs not an
    object, rather than let the call spread a string or an object's keys into arguments."""
    for column, value, wanted in (("args", job.args, list), ("kwargs", job.kwargs, dict)):
        if type(value) is not wanted:
            found = "null" if value is None else JSON_TYPES.get(type(value), "a number")
            raise MalformedJob(
                f"the stored {column} of job {job.id} are malformed: {found}, not "
                f"{JSON_TYPES[wanted]}"
            )


def _settle(job: ClaimedJob, handler: Handler, value: Any) -> Outcome:
    try:
        result = normalize_json(value, where=f"the return value of {job.task}")
    except TypeError as error:
        return failure(job, handler, error)
    return Outcome(job, "completed", result=result)


def _steer(job: ClaimedJob, handler: Handler | None, error: BaseException) -> Outcome:
    if isinstance(error, Snooze):
        return Outcome(job, "scheduled", delay=error.seconds, attempt_given_back=1)
    if isinstance(error, Discard):
        return Outcome(job, "failed", error=error_entry(job, error))
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
        check_stored_arguments(job)
        if handler.hooks is not None:
            return _run_hooked(job, handler, handler.hooks.begin(job))
        value = handler.func(*job.args, **job.kwargs)
        return _settle(job, handler, value)
    except BaseException as error:
        return _steer(job, handler, error)
    finally:
        close_old_connections()


async def run_async(job: ClaimedJob, handler: Handler) -> Outcome:
    """Run an async handler on the worker's event loop; its timeout cancels it.

    Django's connection-age handling runs around it too, in the thread where the ORM's async
    methods run their queries.
    """
    deadline = asyncio.timeout(handler.timeout)
    try:
        await sync_to_async(close_old_connections)()
        check_stored_arguments(job)
        if handler.hooks is not None:
            attempt = await handler.hooks.abegin(job)
            outcome = await _call_async(job, handler, deadline, attempt.args, attempt.kwargs)
            await _end_async(job, attempt, outcome)
            return outcome
        return await _call_async(job, handler, deadline, job.args, job.kwargs)
    except Exception as error:
        return _steer(job, handler, error)
    finally:
        await sync_to_async(close_old_connections)()


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
