"""What a job's task path resolves to, and how long a failed attempt waits before the next.

Shared by the worker, which runs handlers, and the rescuer, which retries jobs whose worker
died, so it depends on neither.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from functools import lru_cache
from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol

from django_eddyq.base import Task
from django_eddyq.exceptions import TaskNotFound

if TYPE_CHECKING:
    from django_eddyq.worker.execution import ClaimedJob, Outcome

logger = logging.getLogger("django_eddyq")


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
    """What a task path resolves to: the function and the options the worker needs.

    ``hooks`` is None for eddyq's own tasks and plain callables, which the worker calls with
    the job's arguments and nothing around; a Django task has hooks that give its context and
    send Django's ``task_started`` and ``task_finished`` signals.
    """

    func: Callable[..., Any]
    timeout: float | None
    backoff: Callable[[int], float | timedelta] | None
    hooks: AttemptHooks | None = None
    # Decided once: inspect.iscoroutinefunction costs more than calling a no-op job.
    is_async: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.func))


@lru_cache(maxsize=4096)
def resolve(path: str) -> Handler:
    """The handler of the task at ``module.qualname``."""
    return _handler_for(import_task(path), path)


def import_task(path: str) -> Any:
    """Import ``module.qualname``, trying the longest importable module prefix."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name, attributes = ".".join(parts[:split]), parts[split:]
        try:
            target: Any = import_module(module_name)
        except ImportError as error:
            if error.name is not None and not module_name.startswith(error.name):
                # The module exists but itself failed to import something: say so.
                raise TaskNotFound(f"cannot import task {path!r}: {error}") from error
            continue
        try:
            for attribute in attributes:
                target = getattr(target, attribute)
        except AttributeError as error:
            raise TaskNotFound(f"cannot import task {path!r}: {error}") from error
        return target
    raise TaskNotFound(f"cannot import task {path!r}: no such module")


def _handler_for(target: Any, path: str) -> Handler:
    if isinstance(target, Task):
        timeout = target.timeout.total_seconds() if target.timeout is not None else None
        return Handler(func=target.func, timeout=timeout, backoff=target.backoff)
    django_task_class = _django_task_class()
    if django_task_class is not None and isinstance(target, django_task_class):
        from django_eddyq.backend import django_task_handler

        return django_task_handler(target)
    if callable(target):
        return Handler(func=target, timeout=None, backoff=None)
    raise TaskNotFound(f"cannot run task {path!r}: it is a {type(target).__name__}, not a callable")


def _django_task_class() -> type[Any] | None:
    """``django.tasks.Task``, or None on Django 5.2 without the django-tasks backport."""
    try:
        from django_eddyq.compat import Task as DjangoTask
    except ImportError:
        return None
    return DjangoTask


def default_backoff(attempt: int) -> float:
    """River's curve: attempt⁴ seconds, with ±10 % jitter so retries don't arrive in step."""
    return float(attempt**4) * random.uniform(0.9, 1.1)


def retry_delay(handler: Handler | None, attempt: int) -> float:
    """Seconds until the next attempt; a task's own backoff that fails falls back to ours."""
    if handler is None or handler.backoff is None:
        return default_backoff(attempt)
    try:
        delay = handler.backoff(attempt)
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    except Exception:
        logger.exception("eddyq: the backoff of a task failed; using the default backoff")
        return default_backoff(attempt)
    if not math.isfinite(seconds):
        logger.error("eddyq: a task's backoff returned %r; using the default backoff", seconds)
        return default_backoff(attempt)
    return max(seconds, 0.0)
