"""Which jobs an operator means: ``JobFilter``, one description of a set of jobs that the
command line (``manage.py eddyq jobs``, ``retry``, ``cancel``, ``delete``) and the admin's list
and its "all matching" actions both read the same way, and the job search they share."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Cast
from django.utils.text import smart_split, unescape_string_literal

from django_eddyq.vocabulary import JobState

BIGINT_MAX = 2**63 - 1
#: ASCII digits only: str.isdigit() passes "²", which int() refuses, and int() reads "١٢٣".
_DIGITS = re.compile(r"[0-9]+")


def parse_id(text: str) -> int | None:
    """``text`` as a row id: ASCII digits within bigint (int() refuses over 4300 digits, the
    database past bigint), else None."""
    if not _DIGITS.fullmatch(text) or len(text) > len(str(BIGINT_MAX)):
        return None
    number = int(text)
    return number if number <= BIGINT_MAX else None


def in_states(states: list[str] | tuple[str, ...]) -> Q:
    """Jobs in any of ``states``, written so that each state's partial index can serve it: the
    available jobs are in two indexes, those without a limit key (the claim's) and those with
    one (the keyed claim's), so that state is asked of each half, which PostgreSQL then ORs."""
    condition = Q(state__in=[state for state in states if state != JobState.AVAILABLE])
    if JobState.AVAILABLE in states:
        condition |= Q(state=JobState.AVAILABLE, limit_key__isnull=True)
        condition |= Q(state=JobState.AVAILABLE, limit_key__isnull=False)
    return condition


@dataclass(frozen=True)
class JobFilter:
    """A set of jobs: those matching every field given (within a field, any of its values).

    ``since`` and ``until`` bound when the job was enqueued (``created_at``): since is
    inclusive, until exclusive. ``search`` is the admin's search: a number finds the job of
    that id; words must each be part of the task path or, with ``search_arguments``, of the
    arguments' JSON. A filter with no field given selects every job.
    """

    states: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    batch: int | None = None
    limit_key: str | None = None  # the key of its task's limits ("" for the whole task)
    since: datetime | None = None
    until: datetime | None = None
    search: str = ""
    search_arguments: bool = False
    ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.states) - set(JobState.values)
        if unknown:
            raise ValueError(f"not a job state: {', '.join(sorted(unknown))}")
        if any(not 0 < job_id <= BIGINT_MAX for job_id in self.ids):
            raise ValueError("a job id is a positive bigint")

    @property
    def selects_everything(self) -> bool:
        return not (
            self.states
            or self.queues
            or self.tasks
            or self.batch is not None
            or self.limit_key is not None
            or self.since
            or self.until
            or self.search.strip()
            or self.ids
        )

    def apply(self, queryset: models.QuerySet[Any]) -> models.QuerySet[Any]:
        """``queryset`` narrowed to the jobs of this filter."""
        if self.ids:
            queryset = queryset.filter(pk__in=sorted(set(self.ids)))
        if self.states:
            queryset = queryset.filter(in_states(self.states))
        if self.queues:
            queryset = queryset.filter(queue__in=list(self.queues))
        if self.tasks:
            queryset = queryset.filter(task__in=list(self.tasks))
        if self.batch is not None:
            queryset = queryset.filter(batch_id=self.batch)
        if self.limit_key is not None:
            queryset = queryset.filter(limit_key=self.limit_key)
        if self.since is not None:
            queryset = queryset.filter(created_at__gte=self.since)
        if self.until is not None:
            queryset = queryset.filter(created_at__lt=self.until)
        if self.search.strip():
            queryset = search_jobs(queryset, self.search, arguments=self.search_arguments)
        return queryset

    def describe(self) -> str:
        """The filter in words: "failed jobs of queue emails enqueued since …"."""
        parts = []
        if self.ids:
            shown = ", ".join(f"#{job_id}" for job_id in sorted(self.ids)[:10])
            more = len(self.ids) - 10
            parts.append(f"ids {shown}" + (f" and {more} more" if more > 0 else ""))
        if self.states:
            parts.append("in state " + " or ".join(self.states))
        if self.queues:
            parts.append("of queue " + " or ".join(self.queues))
        if self.tasks:
            parts.append("of task " + " or ".join(self.tasks))
        if self.batch is not None:
            parts.append(f"of batch {self.batch}")
        if self.limit_key is not None:
            parts.append(f"of limit key {self.limit_key!r}")
        if self.since is not None:
            parts.append(f"enqueued since {self.since.isoformat(timespec='seconds')}")
        if self.until is not None:
            parts.append(f"enqueued before {self.until.isoformat(timespec='seconds')}")
        if self.search.strip():
            parts.append(f"matching the search {self.search.strip()!r}")
        return "jobs " + ", ".join(parts) if parts else "every job"


def search_jobs(
    queryset: models.QuerySet[Any], term: str, *, arguments: bool
) -> models.QuerySet[Any]:
    """A number finds the job of that id, at once. Other words must each be part of the task
    path or, with ``arguments``, of the arguments' JSON, which means reading every job the
    other filters keep."""
    term = term.strip()
    if _DIGITS.fullmatch(term):
        job_id = parse_id(term)
        return queryset.none() if job_id is None else queryset.filter(pk=job_id)
    if arguments:
        queryset = queryset.alias(
            args_text=Cast("args", models.TextField()),
            kwargs_text=Cast("kwargs", models.TextField()),
        )
    for word in smart_split(term):
        if word[0] in "\"'" and word[0] == word[-1] and len(word) > 1:
            word = unescape_string_literal(word)
        if word:
            found = Q(task__icontains=word)
            if arguments:
                found |= Q(args_text__icontains=word) | Q(kwargs_text__icontains=word)
            queryset = queryset.filter(found)
    return queryset
