"""Periodic schedules: cron schedules become jobs, each scheduled run exactly once; an operator
lists them, runs one now, disables and enables them."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from croniter import croniter
from django.db import connections, transaction

from django_eddyq import registry, sql
from django_eddyq.arguments import normalize_arguments
from django_eddyq.conf import eddyq_settings
from django_eddyq.db import database_now
from django_eddyq.enqueue import JobSpec, default_queue, insert_jobs
from django_eddyq.exceptions import ScheduleNotFound
from django_eddyq.maintenance.service import Service
from django_eddyq.tasks import SCHEDULED_TASKS, Task, validate_cron
from django_eddyq.vocabulary import validate_priority, validate_queue_name

if TYPE_CHECKING:
    from django_eddyq.models import Job

logger = logging.getLogger(__name__)

# The longest the enqueuer sleeps, so that a changed clock or schedule is noticed.
MAX_SLEEP_SECONDS = 60.0
PERIODIC_KEYS = frozenset({"task", "cron", "args", "kwargs", "queue", "priority", "timezone"})


@dataclasses.dataclass(frozen=True, slots=True)
class PeriodicJob:
    """One schedule: enqueue ``task`` at every time ``cron`` names, in ``timezone``."""

    name: str
    task: str
    cron: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    queue: str | None = None
    priority: int = 0
    timezone: str = "UTC"
    max_attempts: int | None = None
    retention: Mapping[str, float | None] | None = None

    @classmethod
    def from_setting(cls, name: str, options: Mapping[str, object]) -> PeriodicJob:
        """Build and validate an ``EDDYQ["PERIODIC"]`` entry; ValueError names what is wrong."""
        where = f'EDDYQ["PERIODIC"][{name!r}]'
        unknown = set(options) - PERIODIC_KEYS
        if unknown:
            raise ValueError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
        task = options.get("task")
        if not isinstance(task, str) or not task:
            raise ValueError(f'{where}["task"] must be the dotted path of a task')
        args, kwargs = options.get("args", ()), options.get("kwargs", {})
        try:
            declared = _declared_task(task)
            normal_args, normal_kwargs = normalize_arguments(args, kwargs)  # type: ignore[arg-type]
            job = cls(
                name=name,
                task=task,
                cron=validate_cron(options.get("cron")),
                args=tuple(normal_args),
                kwargs=normal_kwargs,
                queue=(
                    validate_queue_name(options["queue"])
                    if options.get("queue") is not None
                    else declared.queue
                    if declared
                    else None
                ),
                priority=validate_priority(
                    options.get("priority", declared.priority if declared else 0)
                ),
                timezone=str(options.get("timezone", "UTC")),
                max_attempts=declared.max_attempts if declared else None,
                retention=declared.retention if declared else None,
            )
            job.zone()
        except (TypeError, ValueError, LookupError) as error:
            raise ValueError(f"{where}: {error}") from error
        return job

    def zone(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.timezone)
        except (ValueError, KeyError) as error:
            raise ValueError(f"unknown timezone {self.timezone!r}") from error

    def latest_run(self, now: datetime) -> datetime:
        """The latest scheduled time at or before ``now``."""
        local = now.astimezone(self.zone())
        # croniter's get_prev is strictly before its start: start a hair after now.
        previous: datetime = croniter(self.cron, local + timedelta(microseconds=1)).get_prev(
            datetime
        )
        return previous.astimezone(UTC)

    def next_run(self, now: datetime) -> datetime:
        nxt: datetime = croniter(self.cron, now.astimezone(self.zone())).get_next(datetime)
        return nxt.astimezone(UTC)

    def job_spec(self, *, run_at: datetime | None) -> JobSpec:
        """The job of one run: of the run scheduled for ``run_at``, or, for None, one an
        operator asked for now (``run_periodic_now``), which its metadata says."""
        metadata: dict[str, Any] = {"periodic": self.name}
        if run_at is None:
            metadata["manual"] = True
        else:
            metadata["scheduled_for"] = run_at.isoformat()
        return JobSpec(
            task=self.task,
            args=list(self.args),
            kwargs=dict(self.kwargs),
            queue=self.queue or default_queue(),
            priority=self.priority,
            max_attempts=self.max_attempts or eddyq_settings.MAX_ATTEMPTS,
            run_at=run_at,
            delay=0.0,
            retention=dict(self.retention) if self.retention is not None else None,
            metadata=metadata,
        )


def _declared_task(path: str) -> Task[..., Any] | None:
    """The ``@task`` registered as ``path``, whose options are a schedule's defaults; None for a
    Django task. ``TaskNotFound`` (a ``LookupError``) if no task is registered as ``path``."""
    found = registry.lookup(path).task
    return found if isinstance(found, Task) else None


def periodic_jobs() -> list[PeriodicJob]:
    """Schedules from ``EDDYQ["PERIODIC"]`` and from ``@task(cron=...)`` in loaded tasks.

    An invalid entry is logged and left out (system check E008 reports it at start-up): one
    bad schedule must not stop the others.
    """
    schedules = []
    for name, options in eddyq_settings.PERIODIC.items():
        try:
            schedules.append(PeriodicJob.from_setting(name, options))
        except ValueError:
            logger.exception("eddyq periodic: schedule %r is invalid and was skipped", name)
    schedules += [
        PeriodicJob(
            name=path,
            task=path,
            cron=declared.cron,
            queue=declared.queue,
            priority=declared.priority,
            max_attempts=declared.max_attempts,
            retention=declared.retention,
        )
        for path, declared in SCHEDULED_TASKS.items()
        if declared.cron is not None
    ]
    return schedules


class PeriodicEnqueuer(Service):
    """Enqueues each schedule's runs with ``run_at`` = the scheduled time.

    Never the same run twice, not even across a leader failover: enqueuing advances the
    schedule's row in ``eddyq_periodic`` only forwards, in the same transaction. Runs missed
    while no leader existed: only the latest is enqueued. A schedule seen for the first time
    starts from its next run. A disabled schedule enqueues nothing: its row is read under the
    lock that its enqueue takes, so a disable committed while a pass runs is honoured.
    """

    name = "periodic"
    verb = "enqueued"

    def interval(self) -> float | None:
        return MAX_SLEEP_SECONDS if periodic_jobs() else None

    def run_once(self, now: datetime | None = None) -> int:
        now = now or self.database_now()
        schedules = periodic_jobs()
        enqueued = 0
        with self.cursor() as cursor:
            # Schedules no longer configured anywhere for a while are forgotten: one added
            # back later starts afresh, from its next run, enabled.
            cursor.execute(
                sql.FORGET_PERIODIC_SCHEDULES,
                {"names": [s.name for s in schedules], "now": now},
            )
            cursor.execute(sql.SELECT_PERIODIC_SCHEDULES)
            rows = {name: (last, enabled) for name, last, enabled in cursor.fetchall()}
        for schedule in schedules:
            due = schedule.latest_run(now)
            last, enabled = rows.get(schedule.name, (None, True))
            if not enabled or (last is not None and last >= due):
                continue
            params: dict[str, Any] = {"name": schedule.name, "run_at": due}
            with self.atomic(), self.cursor() as cursor:
                cursor.execute(sql.LOCK_PERIODIC_SCHEDULE, params)
                locked = cursor.fetchone()
                if locked is None:
                    # A new schedule starts from its next run.
                    cursor.execute(sql.START_PERIODIC_SCHEDULE, params)
                    continue
                done, enabled = locked
                if done or not enabled:
                    continue  # another leader enqueued this run already, or it was disabled
                [job] = insert_jobs([schedule.job_spec(run_at=due)], own_trace=True)
                cursor.execute(sql.ADVANCE_PERIODIC_SCHEDULE, {**params, "job_id": job.pk})
                enqueued += 1
        return enqueued

    def next_delay(self, interval: float) -> float:
        now = self.database_now()
        soonest = min((s.next_run(now) for s in periodic_jobs()), default=None)
        if soonest is None:
            return interval
        return min(interval, max((soonest - now).total_seconds(), 0.0))


# What an operator sees and does: the admin's "Periodic schedules" page and ``manage.py eddyq
# periodic`` call these.

#: The most rows of ``eddyq_periodic`` a list reads (it holds one per schedule).
LIST_LIMIT = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleStatus:
    """One schedule as an operator sees it, by the database's clock.

    ``configured`` is False for a row whose schedule is no longer in the configuration (the
    enqueuer forgets it after a day); its task, cron and the rest are then None.
    ``next_run_at`` is when the enqueuer next enqueues a run: None while disabled; a time in the
    past when a run is due but not enqueued yet (no leader, or its pass has not come).
    ``last_run_at`` is the latest run the enqueuer dealt with (enqueued, or passed over while
    the schedule was disabled); ``last_job_id`` the job of the last run it enqueued, which
    retention may have deleted since.
    """

    name: str
    enabled: bool
    configured: bool
    task: str | None = None
    cron: str | None = None
    timezone: str | None = None
    queue: str | None = None
    priority: int | None = None
    next_run_at: datetime | None = None
    last_run_at: datetime | None = None
    last_job_id: int | None = None


def periodic_schedules(*, now: datetime | None = None) -> list[ScheduleStatus]:
    """Every configured schedule, with its row if the enqueuer (or an operator) made one,
    then the rows of schedules no longer configured; each group by name. Next runs are
    reckoned from ``now``, by default the database's clock."""
    schedules = {schedule.name: schedule for schedule in _configured_schedules()}
    with connections[eddyq_settings.DATABASE].cursor() as cursor:
        now = now or database_now(cursor)
        cursor.execute(sql.LIST_PERIODIC_SCHEDULES, {"limit": LIST_LIMIT})
        rows = {name: (last, job_id, enabled) for name, last, job_id, enabled in cursor}
    listed = []
    for name in sorted(schedules):
        schedule = schedules[name]
        last, job_id, enabled = rows.get(name, (None, None, True))
        listed.append(
            ScheduleStatus(
                name=name,
                enabled=enabled,
                configured=True,
                task=schedule.task,
                cron=schedule.cron,
                timezone=schedule.timezone,
                queue=schedule.queue or default_queue(),
                priority=schedule.priority,
                next_run_at=_next_run(schedule, now, last, has_row=name in rows)
                if enabled
                else None,
                last_run_at=last,
                last_job_id=job_id,
            )
        )
    listed += [
        ScheduleStatus(
            name=name, enabled=enabled, configured=False, last_run_at=last, last_job_id=job_id
        )
        for name, (last, job_id, enabled) in sorted(rows.items())
        if name not in schedules
    ]
    return listed


def run_periodic_now(name: str) -> Job:
    """Enqueue one run of the schedule ``name`` now, disabled or not, and return its job.

    The job is the schedule's (task, arguments, queue, priority), its metadata marking it a
    manual run (``"manual": true``); the schedule's own runs go on as before: its next run
    is enqueued when due. ``ScheduleNotFound`` (a ``LookupError``) if no schedule of that name
    is configured.
    """
    schedule = _configured_schedule(name)
    with transaction.atomic(using=eddyq_settings.DATABASE):
        [job] = insert_jobs([schedule.job_spec(run_at=None)])
    return job


def set_periodic_enabled(name: str, enabled: bool, *, now: datetime | None = None) -> bool:
    """Enable or disable the schedule ``name``; whether that changed anything.

    A disabled schedule enqueues nothing, whichever process leads. Enabled again, it resumes
    from its next run after ``now`` (by default the database's clock): the runs that came due
    meanwhile are not enqueued. A configured schedule that has no row yet gets one.
    ``ScheduleNotFound`` (a ``LookupError``) if no schedule of that name is configured.
    """
    schedule = _configured_schedule(name)
    alias = eddyq_settings.DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        now = now or database_now(cursor)
        params: dict[str, Any] = {
            "name": name,
            "run_at": schedule.latest_run(now),
            "enabled": enabled,
        }
        cursor.execute(sql.LOCK_PERIODIC_SCHEDULE, params)
        locked = cursor.fetchone()
        cursor.execute(sql.SET_PERIODIC_ENABLED, params)
    was_enabled = True if locked is None else locked[1]  # a schedule without a row runs
    return bool(was_enabled != enabled)


def _configured_schedules() -> list[PeriodicJob]:
    # The @task(cron=...) schedules are declared as their tasks modules are imported, which a
    # web process or a command has not necessarily done yet.
    registry.discover()
    return periodic_jobs()


def _configured_schedule(name: str) -> PeriodicJob:
    for schedule in _configured_schedules():
        if schedule.name == name:
            return schedule
    raise ScheduleNotFound(name)


def _next_run(
    schedule: PeriodicJob, now: datetime, last: datetime | None, *, has_row: bool
) -> datetime:
    """When the enqueuer next enqueues a run of the enabled ``schedule``: its latest run if
    that is due and not enqueued yet, else its next one. Without a row it starts from its next
    run."""
    latest = schedule.latest_run(now)
    if has_row and last is not None and last < latest:
        return latest
    return schedule.next_run(now)
