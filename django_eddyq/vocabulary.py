"""The queue's vocabulary: job and batch states and their groups, priorities, queue names.

A leaf: every other module takes these from here, and this module imports nothing of the
package. Importable before Django's apps are ready (settings and tasks modules import the
package early).
"""

from __future__ import annotations

import re
from typing import TypeGuard

from django.db import models
from django.utils.translation import gettext_lazy as _


class JobState(models.TextChoices):
    """Where a job is in its life; the ``state`` column of ``eddyq_jobs``."""

    # A workflow's step waiting for the steps it depends on (``workflows.py``).
    PENDING = "pending", _("pending")
    SCHEDULED = "scheduled", _("scheduled")
    AVAILABLE = "available", _("available")
    RUNNING = "running", _("running")
    RETRYABLE = "retryable", _("retryable")
    COMPLETED = "completed", _("completed")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


# The groups are tuples of plain strings, in the order of the states: SQL and migrations spell
# them that way, and messages show them as the words they are.
#: Waiting for their time (``run_at``): the scheduler makes them available when it comes.
WAITING_STATES = (JobState.SCHEDULED.value, JobState.RETRYABLE.value)
#: Not ended yet: a batch, a queue, a unique key wait for these.
UNFINISHED_STATES = (
    JobState.PENDING.value,
    JobState.SCHEDULED.value,
    JobState.AVAILABLE.value,
    JobState.RUNNING.value,
    JobState.RETRYABLE.value,
)
#: Ended for good; also the states a retention is set for.
TERMINAL_STATES = (JobState.COMPLETED.value, JobState.FAILED.value, JobState.CANCELLED.value)


class WorkflowState(models.TextChoices):
    RUNNING = "running", _("running")
    COMPLETED = "completed", _("completed")  # every step completed
    FAILED = "failed", _("failed")  # every step ended, some failed or were cancelled
    CANCELLED = "cancelled", _("cancelled")  # cancelled as a whole


class BatchState(models.TextChoices):
    PENDING = "pending", _("pending")
    COMPLETE = "complete", _("complete")


PRIORITY_MIN = -100
PRIORITY_MAX = 100
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
QUEUE_NAME_RULE = "1 to 64 letters, digits or _ . : -"


def is_queue_name(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and QUEUE_NAME.fullmatch(value) is not None


def is_positive_int(value: object) -> TypeGuard[int]:
    """An ``int`` of 1 or more; a ``bool`` is not one, though Python says it is an int."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def validate_queue_name(name: object) -> str:
    if is_queue_name(name):
        return name
    raise ValueError(f"queue name {name!r} is invalid: use {QUEUE_NAME_RULE}")


def validate_priority(priority: object) -> int:
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not PRIORITY_MIN <= priority <= PRIORITY_MAX
    ):
        raise ValueError(
            f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, not {priority!r}"
        )
    return priority


def validate_positive_int(value: object, name: str) -> int:
    if is_positive_int(value):
        return value
    raise ValueError(f"{name} must be an integer ≥ 1, not {value!r}")
