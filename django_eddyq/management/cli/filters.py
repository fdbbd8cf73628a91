"""The filter options that ``eddyq jobs``, ``retry``, ``cancel`` and ``delete`` share, read into
one ``selection.JobFilter``: ``--state``, ``--queue``, ``--task`` (each repeatable),
``--since`` and ``--until`` (when the job was enqueued: an ISO 8601 time, or a duration ago
like ``1h`` or ``2d`` by the database's clock) and ``--search``."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.utils import timezone

from django_eddyq.conf import eddyq_settings
from django_eddyq.db import database_now
from django_eddyq.durations import UNITS_HINT, parse_duration
from django_eddyq.selection import JobFilter
from django_eddyq.vocabulary import JobState, validate_queue_name


def moment(value: str) -> datetime | timedelta:
    """An ISO 8601 time (without a zone, in the project's TIME_ZONE), or a duration ago."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        try:
            return parse_duration(value, name="duration")
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{value!r} is neither an ISO 8601 time (2026-05-01T12:00) nor a duration "
                f"ago ({UNITS_HINT})"
            ) from None
    return timezone.make_aware(when) if timezone.is_naive(when) else when


def queue_name(value: str) -> str:
    try:
        return validate_queue_name(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("filters (a job must match each one given)")
    group.add_argument(
        "--state",
        action="append",
        choices=JobState.values,
        default=[],
        help="Jobs in this state (repeat for any of several).",
    )
    group.add_argument(
        "--queue",
        action="append",
        type=queue_name,
        default=[],
        help="Jobs of this queue (repeatable).",
    )
    group.add_argument(
        "--task",
        action="append",
        default=[],
        metavar="PATH",
        help="Jobs of this task, by its full path (repeatable).",
    )
    for name, which in (("since", "at or after"), ("until", "before")):
        group.add_argument(
            f"--{name}",
            type=moment,
            metavar="WHEN",
            help=f"Jobs enqueued {which} WHEN: an ISO 8601 time, or a duration ago (1h, 2d).",
        )
    group.add_argument(
        "--search",
        default="",
        metavar="TEXT",
        help="A job id, or words that must each be part of the task path.",
    )


def job_filter(options: dict[str, Any], ids: tuple[int, ...] = ()) -> JobFilter:
    """The filter of the parsed ``options``; a duration ago is taken from the database's now."""
    since, until = options["since"], options["until"]
    if isinstance(since, timedelta) or isinstance(until, timedelta):
        with connections[eddyq_settings.DATABASE].cursor() as cursor:
            now = database_now(cursor)
        since = now - since if isinstance(since, timedelta) else since
        until = now - until if isinstance(until, timedelta) else until
    return JobFilter(
        states=tuple(options["state"]),
        queues=tuple(options["queue"]),
        tasks=tuple(options["task"]),
        since=since,
        until=until,
        search=options["search"],
        ids=ids,
    )
