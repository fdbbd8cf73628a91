"""How a worker runs a task's jobs, and how long a failed attempt waits before the next.

Shared by the worker, which runs handlers, and the rescuer, which retries jobs whose worker
died, so it depends on neither. Which handler a job gets is the registry's answer.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from django_eddyq.durations import delay_seconds
from django_eddyq.limits import Limits

if TYPE_CHECKING:
    from django_eddyq.worker.execution import ClaimedJob, Outcome

logger = logging.getLogger(__name__)


class Attempt(Protocol):
    """One attempt of a hooked handler: what to call it with; told how the attempt ended."""

    @property
    def args(self) -> Sequence[Any]: ...

    @property
    def kwargs(self) -> Mapping[str, Any]: ...

    def end(self, outcome: Outcome) -> None:
        """Called on the handler's thread once the outcome is decided, before it is stored.

        It may add keys to ``outcome.error``, which is stored; what it raises is logged.
        """

    async def aend(self, outcome: Outcome) -> None:
        """``end`` for an async handler, on the worker's event loop."""


class AttemptHooks(Protocol):
    """Runs around each attempt of a task that needs more than a call (a Django task)."""

    def begin(self, job: ClaimedJob) -> Attempt:
        """Called on the handler's thread before the call; raising fails the attempt."""

    async def abegin(self, job: ClaimedJob) -> Attempt:
        """``begin`` for an async handler, on the worker's event loop."""


@dataclasses.dataclass(frozen=True, slots=True)
class Handler:
    """How to run a declared task's jobs: the function and the options the worker needs.

    ``hooks`` is None for eddyq's own tasks, which the worker calls with the job's arguments
    and nothing around; a Django task has hooks that give its context and
    send Django's ``task_started`` and ``task_finished`` signals. An ``atomic`` handler runs in
    a transaction on the queue's database that also writes its job's completion.
    """

    func: Callable[..., Any]
    timeout: float | None
    backoff: Callable[[int], float | timedelta] | None
    hooks: AttemptHooks | None = None
    limits: Limits | None = None  # per key: the keyed claim takes the task's jobs
    atomic: bool = False
    # Decided once: inspect.iscoroutinefunction costs more than calling a no-op job.
    is_async: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.func))
        if type(self.atomic) is not bool:
            raise TypeError(f"atomic must be True or False, not {self.atomic!r}")
        if self.atomic and self.is_async:
            raise TypeError(
                f"{self.func.__module__}.{self.func.__qualname__} is async and cannot be "
                "atomic: Django runs an async function's queries on a thread shared with other "
                "coroutines, so no transaction could hold this job's writes alone. Make it a "
                "plain function, or leave atomic off (see docs/atomic-handlers.md)"
            )


def default_backoff(attempt: int) -> float:
    """River's curve: attempt⁴ seconds, with ±10 % jitter so retries don't arrive in step."""
    return delay_seconds(float(attempt) ** 4 * random.uniform(0.9, 1.1), name="the default backoff")


def retry_delay(handler: Handler | None, attempt: int) -> float:
    """Seconds until the next attempt: the task's backoff, cut to ``durations.MAX_DELAY``; one
    that raises or returns no usable delay falls back to the default, with an ERROR logged."""
    if handler is None or handler.backoff is None:
        return default_backoff(attempt)
    try:
        return delay_seconds(handler.backoff(attempt), name="a task's backoff")
    except Exception:
        logger.exception("eddyq: the backoff of a task failed; using the default backoff")
        return default_backoff(attempt)
