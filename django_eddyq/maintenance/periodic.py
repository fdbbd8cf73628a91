"""The periodic enqueuer: cron schedules become jobs, each scheduled run exactly once."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from django_eddyq import registry, sql
from django_eddyq.arguments import normalize_arguments
from django_eddyq.conf import eddyq_settings
from django_eddyq.enqueue import JobSpec, default_queue, insert_jobs
from django_eddyq.maintenance.service import Service
from django_eddyq.tasks import SCHEDULED_TASKS, Task, validate_cron
from django_eddyq.vocabulary import validate_priority, validate_queue_name

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
    starts from its next run.
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
            # back later starts afresh, from its next run.
            cursor.execute(
                sql.FORGET_PERIODIC_SCHEDULES,
                {"names": [s.name for s in schedules], "now": now},
            )
            cursor.execute(sql.SELECT_PERIODIC_SCHEDULES)
            last_runs: dict[str, datetime] = dict(cursor.fetchall())
        for schedule in schedules:
            due = schedule.latest_run(now)
            last = last_runs.get(schedule.name)
            if last is not None and last >= due:
                continue
            params: dict[str, Any] = {"name": schedule.name, "run_at": due}
            with self.atomic(), self.cursor() as cursor:
                cursor.execute(sql.LOCK_PERIODIC_SCHEDULE, params)
                locked = cursor.fetchone()
                if locked is None:
                    # A new schedule starts from its next run.
                    cursor.execute(sql.START_PERIODIC_SCHEDULE, params)
                    continue
                if locked[0] >= due:
                    continue  # another leader enqueued this run already
                cursor.execute(sql.ADVANCE_PERIODIC_SCHEDULE, params)
                insert_jobs([self._job_spec(schedule, due)], own_trace=True)
                enqueued += 1
        return enqueued

    def next_delay(self, interval: float) -> float:
        now = self.database_now()
        soonest = min((s.next_run(now) for s in periodic_jobs()), default=None)
        if soonest is None:
            return interval
        return min(interval, max((soonest - now).total_seconds(), 0.0))

    @staticmethod
    def _job_spec(schedule: PeriodicJob, run_at: datetime) -> JobSpec:
        return JobSpec(
            task=schedule.task,
            args=list(schedule.args),
            kwargs=dict(schedule.kwargs),
            queue=schedule.queue or default_queue(),
            priority=schedule.priority,
            max_attempts=schedule.max_attempts or eddyq_settings.MAX_ATTEMPTS,
            run_at=run_at,
            delay=0.0,
            retention=dict(schedule.retention) if schedule.retention is not None else None,
            metadata={"periodic": schedule.name, "scheduled_for": run_at.isoformat()},
        )
