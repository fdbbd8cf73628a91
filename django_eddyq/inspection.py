"""Cheap reads for the admin: bounded counts, estimates, the queue overview; and for the health
probes and the gauges, the queues' latency and the workers' status.

Nothing here reads more rows than a bounded number, however many jobs there are: a count stops
at ``EXACT_COUNT_LIMIT`` and past that becomes an estimate, from the planner's statistics;
queue names come from the queue table, and task paths and the queues' oldest due jobs from skip
scans of their indexes, never from a scan of every job. Their SQL is in ``sql.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from django.core.paginator import EmptyPage, Page, PageNotAnInteger, Paginator
from django.db import connections, models
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from django_eddyq import sql
from django_eddyq.conf import eddyq_settings
from django_eddyq.election import ELECTION
from django_eddyq.models import Job, Leader, Queue, WorkerProcess, WorkflowEdge, WorkflowStep
from django_eddyq.retention import Retention, job_expiries
from django_eddyq.vocabulary import TERMINAL_STATES

if TYPE_CHECKING:
    PaginatorBase = Paginator[Any]
else:
    PaginatorBase = Paginator

#: The first line of the last error, in lists, is cut at this many characters.
ERROR_LINE_CHARACTERS = 160
#: Counts stop here: a count of more rows is an estimate (shown as "about N").
EXACT_COUNT_LIMIT = 10_000
#: Queues listed by the overview and the queue filter, at most.
QUEUE_LIMIT = 100
#: Tasks listed by the task filter, at most.
TASK_LIMIT = 100
#: A worker's status in the registry, by the database's clock: see ``with_worker_status``.
WORKER_STATUSES = ("running", "lost", "stopped")


# The last error of a job, as lists show it.


class LastErrorLine(models.Func):
    """The first line of the last entry of ``errors``, cut short, computed by the database:
    a list never fetches whole tracebacks."""

    template = (
        "left(split_part((%(expressions)s -> -1) ->> 'error', chr(10), 1), "
        f"{ERROR_LINE_CHARACTERS + 1})"
    )
    output_field = models.TextField()


def last_error_line(errors: Any) -> str | None:
    """What ``LastErrorLine`` computes, from a job's ``errors`` already read: None if it holds
    no error of the usual shape."""
    if not isinstance(errors, list) or not errors or not isinstance(errors[-1], dict):
        return None
    error = errors[-1].get("error")
    return str(error).split("\n", 1)[0][: ERROR_LINE_CHARACTERS + 1] if error is not None else None


# Counts and estimates.


def bounded_count(queryset: models.QuerySet[Any], limit: int) -> int:
    """How many rows ``queryset`` selects, reading at most ``limit + 1`` of them.

    The answer is exact up to ``limit``; ``limit + 1`` means "more than ``limit``".
    """
    return queryset.order_by().values("pk")[: limit + 1].count()


def estimated_count(queryset: models.QuerySet[Any]) -> tuple[int, bool]:
    """How many rows ``queryset`` selects, and whether that is an estimate: exact up to
    ``EXACT_COUNT_LIMIT``, the planner's estimate past it (never less than that)."""
    exact = bounded_count(queryset, EXACT_COUNT_LIMIT)
    if exact <= EXACT_COUNT_LIMIT:
        return exact, False
    return max(planner_estimate(queryset) or 0, exact), True


def table_estimate(model: type[models.Model], using: str) -> int | None:
    """The planner's estimate of the rows of ``model``'s table (``pg_class.reltuples``), or
    None if the table has never been vacuumed or analyzed."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.TABLE_ESTIMATE, {"table": model._meta.db_table})
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:
        return None
    return int(row[0])


def planner_estimate(queryset: models.QuerySet[Any]) -> int | None:
    """The planner's estimate of the rows ``queryset`` selects (``EXPLAIN``), or None."""
    try:
        plan = json.loads(queryset.order_by().explain(format="json"))
        return int(plan[0]["Plan"]["Plan Rows"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


class EstimatingPaginator(PaginatorBase):
    """A paginator that never counts more than ``exact_limit`` rows.

    Up to ``exact_limit`` rows it counts exactly (``is_estimate`` False). Past it, ``count``
    is an estimate: ``pg_class.reltuples`` for an unfiltered list, the planner's ``EXPLAIN``
    estimate for a filtered one, never less than ``exact_limit + 1``. Then pages past the
    estimated end are empty rather than errors, and the page links end a few pages after the
    current one instead of at a last page that would need an ``OFFSET`` through the table.
    """

    exact_limit = EXACT_COUNT_LIMIT

    def __init__(
        self,
        object_list: models.QuerySet[Any],
        per_page: int | str,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
        *,
        unfiltered: bool = False,
    ) -> None:
        super().__init__(object_list, per_page, orphans, allow_empty_first_page)
        self.unfiltered = unfiltered
        self.is_estimate = False

    @cached_property
    def count(self) -> int:
        queryset = cast(models.QuerySet[Any], self.object_list)
        exact = bounded_count(queryset, self.exact_limit)
        if exact <= self.exact_limit:
            return exact
        self.is_estimate = True
        if self.unfiltered:
            estimate = table_estimate(queryset.model, queryset.db)
        else:
            estimate = planner_estimate(queryset)
        return max(estimate or 0, exact)

    def validate_number(self, number: int | float | str) -> int:
        if not self.count or not self.is_estimate:
            valid: int = super().validate_number(number)
            return valid
        # Past the estimated end is an empty page, not an error.
        try:
            if isinstance(number, float) and not number.is_integer():
                raise ValueError
            number = int(number)
        except (TypeError, ValueError):
            raise PageNotAnInteger(self.error_messages["invalid_page"]) from None
        if number < 1:
            raise EmptyPage(self.error_messages["min_page"])
        return int(number)

    def page(self, number: int | str) -> Page[Any]:
        valid = self.validate_number(number)
        if not self.is_estimate:
            return super().page(valid)
        bottom = (valid - 1) * self.per_page
        return Page(self.object_list[bottom : bottom + self.per_page], valid, self)

    def get_elided_page_range(
        self, number: int | float | str = 1, *, on_each_side: int = 3, on_ends: int = 2
    ) -> Iterator[str | int]:
        if not self.is_estimate:
            yield from super().get_elided_page_range(
                number, on_each_side=on_each_side, on_ends=on_ends
            )
            return
        current = self.validate_number(number)
        ellipsis = cast(str, self.ELLIPSIS)
        last = current + on_each_side
        if current > on_each_side + on_ends + 1:
            yield from range(1, on_ends + 1)
            yield ellipsis
            yield from range(current - on_each_side, last + 1)
        else:
            yield from range(1, last + 1)
        yield ellipsis


# The overview above the job list.


@dataclass(frozen=True)
class Count:
    """A count that is exact up to its limit, and past it an estimate (or just "more")."""

    value: int
    estimated: bool = False
    more_than: bool = False  # past the limit, with no estimate to give

    def __str__(self) -> str:
        if self.more_than:
            return f"{self.value:,}+"
        if self.estimated:
            return f"≈ {self.value:,}"
        return f"{self.value:,}"


@dataclass(frozen=True)
class StateCount:
    state: str
    label: str
    count: Count


@dataclass(frozen=True)
class QueueStatus:
    name: str
    paused_at: datetime | None
    available: Count
    running: int

    @property
    def is_paused(self) -> bool:
        return self.paused_at is not None


@dataclass(frozen=True)
class LeaderStatus:
    leader_id: str
    elected_at: datetime
    expires_at: datetime
    active: bool


def queue_counts(count_limit: int = EXACT_COUNT_LIMIT) -> dict[str, RawSQL]:
    """Annotations of a query of queues: ``available_count``, their available jobs counted up to
    ``count_limit + 1`` (more than the limit), and ``running_count``, their running jobs."""
    return {
        "available_count": RawSQL(
            sql.QUEUE_AVAILABLE_JOBS,
            (count_limit + 1, count_limit + 1),
            output_field=models.IntegerField(),
        ),
        "running_count": RawSQL(sql.QUEUE_RUNNING_JOBS, (), output_field=models.IntegerField()),
    }


def queue_names(using: str | None = None, limit: int = QUEUE_LIMIT) -> list[str]:
    """The names of the queues of the queue table, sorted, at most ``limit``."""
    queues = Queue.objects.using(using or eddyq_settings.DATABASE).order_by("name")
    return list(queues.values_list("name", flat=True)[:limit])


def task_names(using: str | None = None, limit: int = TASK_LIMIT) -> list[str]:
    """The first ``limit`` task paths of the jobs that are neither available nor running
    (expired ones included), sorted."""
    with connections[using or eddyq_settings.DATABASE].cursor() as cursor:
        cursor.execute(sql.TASK_NAMES, {"limit": limit})
        return [name for (name,) in cursor.fetchall()]


def queue_latencies(using: str | None = None) -> dict[str, float]:
    """Per queue, how long its oldest due available job has waited: seconds since its run_at,
    by the database's clock (``inf`` for a run_at of -infinity). Queues without a due available
    job are left out, paused ones are not. A few index probes per queue and priority
    (``sql.QUEUE_LATENCY``), never a read of every available job."""
    with connections[using or eddyq_settings.DATABASE].cursor() as cursor:
        cursor.execute(sql.QUEUE_LATENCY)
        return {str(queue): float(seconds) for queue, seconds in cursor.fetchall()}


def with_worker_status(
    workers: models.QuerySet[WorkerProcess], stale_after: timedelta | None = None
) -> models.QuerySet[Any]:
    """``workers`` annotated by the database's clock, never the web server's: ``status``,
    ``"running"`` (not stopped, seen within ``stale_after``, STALE_AFTER by default), ``"lost"``
    (not stopped, unseen for longer: killed, frozen or cut off) or ``"stopped"`` (it said so);
    ``status_order``, 0, 1 and 2 in that order; and ``seen_ago``, how long since it was last
    seen (for a stopped worker, since it stopped)."""
    stale_after = eddyq_settings.STALE_AFTER if stale_after is None else stale_after
    stale_since = models.ExpressionWrapper(
        Now() - models.Value(stale_after), output_field=models.DateTimeField()
    )

    def status(values: tuple[Any, ...], field: models.Field[Any, Any]) -> models.Case:
        running, lost, stopped = (models.Value(value) for value in values)
        return models.Case(
            models.When(stopped_at__isnull=False, then=stopped),
            models.When(last_seen_at__lt=stale_since, then=lost),
            default=running,
            output_field=field,
        )

    return workers.annotate(
        status=status(WORKER_STATUSES, models.CharField()),
        status_order=status((0, 1, 2), models.IntegerField()),
        seen_ago=models.ExpressionWrapper(
            Now() - models.F("last_seen_at"), output_field=models.DurationField()
        ),
    )


def state_counts_query(retention: Retention, limit: int) -> tuple[str, list[Any]]:
    """The statement that counts jobs per state for the overview, each count stopping at
    ``limit``, and its parameters: ``sql.state_counts_statement`` with each terminal state's
    expired jobs being those ``Job.objects`` hides under RETENTION ``retention`` (by the
    cleaner's own conditions)."""
    expiries = job_expiries(retention)
    expired: dict[str, str] = {}
    # In the order of the statement's placeholders: a limit for each state, then each terminal
    # state's conditions and a limit, then the limit of the stuck jobs.
    params: list[Any] = [limit] * len(Job.State.values)
    for state in TERMINAL_STATES:
        own = [expiry for expiry in expiries if expiry.state == state]
        expired[state] = " OR ".join(f"({expiry.sql})" for expiry in own)
        params.extend([*(param for expiry in own for param in expiry.params), limit])
    params.append(limit)
    return sql.state_counts_statement(expired), params


class Overview:
    """What the job list shows above itself: counts per state and per queue, stuck jobs and the
    maintenance leader. Each part is one query, run when first read."""

    def __init__(self, using: str | None = None, count_limit: int = EXACT_COUNT_LIMIT) -> None:
        self.using = using or eddyq_settings.DATABASE
        self.count_limit = count_limit

    @cached_property
    def _state_counts(self) -> tuple[dict[str, int], int]:
        """Counts of visible jobs per state, and of running jobs past their lease, each stopping
        past ``count_limit``: one query.

        A terminal state's count is all its jobs minus the expired ones. Past the limit the
        difference is meaningless, but then the count is an estimate anyway.
        """
        statement, params = state_counts_query(eddyq_settings.RETENTION, self.count_limit + 1)
        with connections[self.using].cursor() as cursor:
            cursor.execute(statement, params)
            columns = [column.name for column in cursor.description]
            counted = dict(zip(columns, cursor.fetchone(), strict=True))
        counts = {state: counted[state] for state in Job.State.values}
        for state in TERMINAL_STATES:
            if counts[state] <= self.count_limit:
                counts[state] -= counted[f"{state}_expired"]
        return counts, counted["stuck"]

    def _state_estimates(self) -> dict[str, int]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.STATE_STATISTICS)
            row = cursor.fetchone()
        if row is None or row[0] is None or row[1] is None or not row[2] or row[2] < 0:
            return {}
        values, frequencies, rows = row
        return {
            value: round(frequency * rows)
            for value, frequency in zip(values, frequencies, strict=False)
        }

    def _count(self, exact: int, estimates: Mapping[str, int] | None, key: str) -> Count:
        if exact <= self.count_limit:
            return Count(exact)
        estimate = (estimates or {}).get(key)
        if estimate is None or estimate <= self.count_limit:
            return Count(self.count_limit, more_than=True)
        return Count(estimate, estimated=True)

    @cached_property
    def states(self) -> list[StateCount]:
        counts, _stuck = self._state_counts
        estimates = self._state_estimates() if max(counts.values()) > self.count_limit else None
        return [
            StateCount(state.value, str(state.label), self._count(counts[state], estimates, state))
            for state in Job.State
        ]

    @cached_property
    def stuck(self) -> Count:
        """Running jobs whose lease has passed: the rescuer takes them back, if it runs."""
        return self._count(self._state_counts[1], None, "")

    @cached_property
    def queues(self) -> list[QueueStatus]:
        queues: models.QuerySet[Any] = Queue.objects.using(self.using).annotate(
            **queue_counts(self.count_limit)
        )
        rows = queues.order_by("name").values_list(
            "name", "paused_at", "available_count", "running_count"
        )[:QUEUE_LIMIT]
        return [
            QueueStatus(name, paused_at, self._count(available, None, ""), running)
            for name, paused_at, available, running in rows
        ]

    @cached_property
    def leader(self) -> LeaderStatus | None:
        """The maintenance leader, if one was ever elected; ``active`` while its lease holds."""
        row = (
            Leader.objects.using(self.using)
            .filter(name=ELECTION)
            .exclude(leader_id="")
            .annotate(
                active=models.ExpressionWrapper(
                    models.Q(expires_at__gt=Now()), output_field=models.BooleanField()
                )
            )
            .values_list("leader_id", "elected_at", "expires_at", "active")
            .first()
        )
        if row is None:
            return None
        return LeaderStatus(*row)


#: A workflow's page lists and draws at most this many of its steps.
WORKFLOW_STEPS_SHOWN = 200


@dataclass(frozen=True)
class StepRow:
    """A step on its workflow's page: its job's state, attempts and run time."""

    job_id: int
    name: str
    state: str
    attempt: int
    max_attempts: int
    seconds: float | None  # its last attempt's start to its end; None until it has ended
    after: tuple[int, ...]  # the job ids of the shown steps it depends on


def workflow_steps(
    workflow_id: int, limit: int = WORKFLOW_STEPS_SHOWN, using: str | None = None
) -> list[StepRow]:
    """The first ``limit`` steps of a workflow (in the order they were added), with the edges
    among them: two index reads, of ``limit`` steps and their edges."""
    alias = using or eddyq_settings.DATABASE
    steps = list(
        WorkflowStep.objects.using(alias)
        .filter(workflow_id=workflow_id)
        .order_by("job_id")
        .values_list("job_id", "name")[:limit]
    )
    ids = [job_id for job_id, _name in steps]
    jobs = {
        row[0]: row[1:]
        for row in Job.all_objects.using(alias)
        .filter(pk__in=ids)
        .values_list("id", "state", "attempt", "max_attempts", "attempted_at", "finalized_at")
    }
    after: dict[int, list[int]] = {}
    for upstream, downstream in (
        WorkflowEdge.objects.using(alias)
        .filter(downstream_id__in=ids, upstream_id__in=ids)
        .values_list("upstream_id", "downstream_id")
    ):
        after.setdefault(downstream, []).append(upstream)
    rows = []
    for job_id, name in steps:
        state, attempt, max_attempts, attempted_at, finalized_at = jobs.get(
            job_id, ("deleted", 0, 0, None, None)
        )
        seconds = (
            (finalized_at - attempted_at).total_seconds()
            if finalized_at is not None and attempted_at is not None
            else None
        )
        rows.append(
            StepRow(
                job_id,
                name,
                state,
                attempt,
                max_attempts,
                seconds,
                tuple(sorted(after.get(job_id, ()))),
            )
        )
    return rows
