"""Tasks written with Django's Tasks framework only, for tests/test_backend.py.

``@task`` makes each one with the ``task_class`` of the backend of its alias, and that backend
validates it, when this module is imported: a project configures ``settings.TASKS``; the tests
import this module under ``override_settings(TASKS=...)``.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from django_eddyq import Snooze

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]

# Django 6.1 and the backport hand the decorator's other arguments to the backend's task
# class; Django 6.0's decorator takes none.
FORWARDS_OPTIONS = any(
    parameter.kind is inspect.Parameter.VAR_KEYWORD
    for parameter in inspect.signature(task).parameters.values()
)


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task
def fails(message: str) -> None:
    raise ValueError(message)


@task
def snoozes() -> None:
    raise Snooze(3600)


@task(queue_name="emails", priority=7)
def send_email(to: str) -> str:
    return to


def _context_summary(context: TaskContext) -> dict[str, Any]:
    result = context.task_result
    return {
        "attempt": context.attempt,
        "id": result.id,
        "status": str(result.status),
        "worker_ids": list(result.worker_ids),
        "errors": [error.exception_class_path for error in result.errors],
        "enqueued": result.enqueued_at is not None,
        "backend": result.backend,
    }


@task(takes_context=True)
def describe_context(context: TaskContext, label: str) -> dict[str, Any]:
    return {"label": label, **_context_summary(context)}


@task(takes_context=True)
async def async_describe_context(context: TaskContext, label: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"label": label, **_context_summary(context)}


@task(takes_context=True)
def fails_on_first_attempt(context: TaskContext) -> dict[str, Any]:
    if context.attempt == 1:
        raise RuntimeError("first attempt")
    return _context_summary(context)


if FORWARDS_OPTIONS:

    @task(max_attempts=3, timeout="200ms", retention={"failed": None})
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "late"

    @task(concurrency=1, key=lambda customer, **_: customer)
    def one_import_per_customer(customer: str, part: int) -> int:
        """At most one running per customer, on all workers."""
        return part
