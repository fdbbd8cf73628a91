"""django-eddyq: a durable, fast background job queue on your project's PostgreSQL."""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from django_eddyq.current import cancel_requested, current_job
from django_eddyq.exceptions import Discard, Snooze
from django_eddyq.tasks import Call, Task, task

try:
    __version__ = version("django-eddyq")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"

__all__ = [
    "Call",
    "Discard",
    "Snooze",
    "Task",
    "Workflow",
    "batch",
    "cancel_requested",
    "chain",
    "current_job",
    "current_workflow",
    "group",
    "pause_queue",
    "periodic_schedules",
    "resume_queue",
    "run_periodic_now",
    "set_periodic_enabled",
    "set_queue_limits",
    "task",
]

# These touch the models (or the maintenance services), so they load on first use: importing
# the package (as settings and tasks modules do) must work before Django's apps are ready.
_LAZY = {
    "batch": "django_eddyq.batches",
    "pause_queue": "django_eddyq.queues",
    "resume_queue": "django_eddyq.queues",
    "periodic_schedules": "django_eddyq.maintenance.periodic",
    "run_periodic_now": "django_eddyq.maintenance.periodic",
    "set_periodic_enabled": "django_eddyq.maintenance.periodic",
    "set_queue_limits": "django_eddyq.queues",
    "Workflow": "django_eddyq.workflows",
    "chain": "django_eddyq.workflows",
    "group": "django_eddyq.workflows",
    "current_workflow": "django_eddyq.workflows",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'django_eddyq' has no attribute {name!r}")
