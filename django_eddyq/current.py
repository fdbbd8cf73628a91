"""The job a handler runs for: ``current_job()`` and ``cancel_requested()``.

The worker sets the running job's context around each handler call, on the handler's thread for
a sync handler and in the task's own context for an async one, so that the handler (and any code
it calls) can ask which job it runs for without being passed it.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_eddyq.worker.execution import ClaimedJob


@dataclasses.dataclass(slots=True)
class CancelFlag:
    """Raised by the worker when the running job's cancellation is requested."""

    requested: bool = False


class JobContext:
    """The job a handler runs for: what it was enqueued with, and which attempt this is.

    ``metadata`` holds what ``task.using(metadata={...})`` gave, beside the keys the queue
    writes itself (``periodic``, ``batch_callback``, ...). A good idempotency key for work that
    must happen once per job is ``f"{job.task}:{job.id}"``; one per attempt adds ``job.attempt``.
    """

    __slots__ = ("_cancel", "_job")

    def __init__(self, job: ClaimedJob, cancel: CancelFlag) -> None:
        self._job = job
        self._cancel = cancel

    @property
    def id(self) -> int:
        return self._job.id

    @property
    def task(self) -> str:
        return self._job.task

    @property
    def queue(self) -> str:
        return self._job.queue

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        return self._job.attempt

    @property
    def max_attempts(self) -> int:
        return self._job.max_attempts

    @property
    def batch_id(self) -> int | None:
        return self._job.batch_id

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._job.metadata

    @property
    def enqueued_at(self) -> datetime:
        """When the job was enqueued, by the database's clock (its transaction's start)."""
        return _moment(self._job.enqueued)

    @property
    def due_at(self) -> datetime:
        """When the job was due to run (``run_at``), by the database's clock."""
        return _moment(self._job.due)

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.requested

    def __repr__(self) -> str:
        return f"<JobContext job {self.id} ({self.task}), attempt {self.attempt}>"


def _moment(seconds: float) -> datetime:
    """Epoch seconds as an aware datetime; a time no datetime holds (a row's ±infinity) is
    the nearest one that does."""
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return datetime.max.replace(tzinfo=UTC) if seconds > 0 else datetime.min.replace(tzinfo=UTC)


_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "eddyq_current_job", default=None
)


def enter(job: ClaimedJob, cancel: CancelFlag) -> contextvars.Token[JobContext | None]:
    """Make ``job`` the current job of this context (the worker's call, around a handler)."""
    return _current.set(JobContext(job, cancel))


def leave(token: contextvars.Token[JobContext | None]) -> None:
    _current.reset(token)


def current_job() -> JobContext | None:
    """The job the handler calling this runs for; None outside a job."""
    return _current.get()


def cancel_requested() -> bool:
    """True once the job this handler runs for has been cancelled.

    A long sync handler checks it between steps and raises to stop: it then ends
    ``cancelled``, never retried. (An async handler is cancelled for it.) Outside a job: False.
    """
    context = _current.get()
    return context is not None and context.cancel_requested
