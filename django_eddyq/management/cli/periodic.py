"""``eddyq periodic``: the periodic schedules, when each runs next and when it last ran;
``eddyq periodic run NAME`` enqueues one run now, ``enable NAME`` and ``disable NAME`` steer
one. The same functions as the admin's "Periodic schedules" page (``maintenance.periodic``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from django_eddyq.exceptions import ScheduleNotFound
from django_eddyq.maintenance.periodic import (
    ScheduleStatus,
    periodic_schedules,
    run_periodic_now,
    set_periodic_enabled,
)
from django_eddyq.management.cli.output import NOTHING, OK, Usage, table, to_json

#: What ``eddyq periodic ACTION NAME`` may do.
ACTIONS = ("run", "enable", "disable")
HEADERS = (
    "NAME", "TASK", "CRON", "TIME ZONE", "QUEUE", "STATUS", "NEXT RUN", "LAST RUN", "LAST JOB",
)  # fmt: skip


def status_label(schedule: ScheduleStatus) -> str:
    if not schedule.configured:
        return "not configured"
    return "enabled" if schedule.enabled else "disabled"


def show(stdout: Any, stderr: Any, *, as_json: bool) -> int:
    schedules = periodic_schedules()
    if as_json:
        stdout.write(to_json({"schedules": [dataclasses.asdict(s) for s in schedules]}))
    elif schedules:
        stdout.write(
            table(
                HEADERS,
                [
                    [
                        schedule.name,
                        schedule.task,
                        schedule.cron,
                        schedule.timezone,
                        schedule.queue,
                        status_label(schedule),
                        schedule.next_run_at,
                        schedule.last_run_at,
                        None if schedule.last_job_id is None else str(schedule.last_job_id),
                    ]
                    for schedule in schedules
                ],
            )
        )
    if not schedules:
        stderr.write('No periodic schedules: configure EDDYQ["PERIODIC"] or @task(cron=...).')
        return NOTHING
    return OK


def steer(stdout: Any, stderr: Any, action: str, name: str | None, *, as_json: bool) -> int:
    """``run``, ``enable`` or ``disable`` the schedule ``name``."""
    if not name:
        raise Usage(f"periodic {action} needs the NAME of a schedule")
    try:
        if action == "run":
            job = run_periodic_now(name)
            if as_json:
                stdout.write(to_json({"schedule": name, "job_id": job.pk}))
            else:
                stdout.write(f"Enqueued job {job.pk}: a run of {name} now.")
            return OK
        enabled = action == "enable"
        changed = set_periodic_enabled(name, enabled)
    except ScheduleNotFound as error:
        stderr.write(f"{str(error)[0].upper()}{str(error)[1:]}.")
        return NOTHING
    if as_json:
        stdout.write(to_json({"schedule": name, "enabled": enabled, "changed": changed}))
    else:
        state = "enabled" if enabled else "disabled"
        stdout.write(f"Schedule {name} {'' if changed else 'was already '}{state}.")
    return OK
