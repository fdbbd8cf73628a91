"""django-eddyq: a durable, fast background job queue on your project's PostgreSQL."""

from django_eddyq.base import Call, Task, task
from django_eddyq.exceptions import Discard, Snooze

__all__ = ["Call", "Discard", "Snooze", "Task", "task"]
