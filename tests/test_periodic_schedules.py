"""Periodic schedules an operator steers: a disabled one enqueues nothing, enabled again it
resumes from its next run; listing them, running one now. Every time is injected."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

import django_eddyq
from django_eddyq import task
from django_eddyq.exceptions import ScheduleNotFound
from django_eddyq.maintenance import PeriodicEnqueuer
from django_eddyq.maintenance.periodic import (
    ScheduleStatus,
    periodic_schedules,
    run_periodic_now,
    set_periodic_enabled,
)
from django_eddyq.models import Job, PeriodicSchedule
from django_eddyq.tasks import SCHEDULED_TASKS
from tests import jobs

# The tasks the schedules name are declared as tests.jobs is imported.
assert jobs.record.path == "tests.jobs.record"

pytestmark = pytest.mark.django_db

# In the past of the database clock, so that runs enqueued "now" are available.
NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
NAME = "hourly-report"
PERIODIC = {
    NAME: {
        "task": "tests.jobs.record",
        "cron": "0 * * * *",
        "args": ["report"],
        "queue": "reports",
        "priority": 5,
    },
}
configured = override_settings(EDDYQ={"PERIODIC": PERIODIC})


def row() -> PeriodicSchedule:
    return PeriodicSchedule.objects.get(name=NAME)


# The enqueuer.


@configured
def test_a_disabled_schedule_enqueues_nothing() -> None:
    enqueuer = PeriodicEnqueuer()
    enqueuer.run_once(now=NOW)
    assert set_periodic_enabled(NAME, False, now=NOW + timedelta(minutes=10)) is True
    assert set_periodic_enabled(NAME, False, now=NOW + timedelta(minutes=20)) is False
    assert enqueuer.run_once(now=NOW + HOUR) == 0
    assert enqueuer.run_once(now=NOW + 5 * HOUR) == 0
    assert not Job.all_objects.exists()
    assert (row().enabled, row().last_run_at) == (False, NOW)


@configured
def test_enabled_again_it_resumes_from_its_next_run() -> None:
    enqueuer = PeriodicEnqueuer()
    enqueuer.run_once(now=NOW)
    set_periodic_enabled(NAME, False, now=NOW + timedelta(minutes=10))
    # Runs at 13:00, 14:00 and 15:00 come due while it is disabled; no leader pass sees 15:00.
    enqueuer.run_once(now=NOW + 2 * HOUR)
    assert set_periodic_enabled(NAME, True, now=NOW + 3 * HOUR + timedelta(minutes=5)) is True
    assert row().last_run_at == NOW + 3 * HOUR
    # No burst of the runs it missed, not even the latest: the next is 16:00.
    assert enqueuer.run_once(now=NOW + 3 * HOUR + timedelta(minutes=6)) == 0
    assert enqueuer.run_once(now=NOW + 4 * HOUR) == 1
    [job] = Job.objects.all()
    assert job.run_at == NOW + 4 * HOUR
    assert row().last_job_id == job.pk


@configured
def test_enabling_an_enabled_schedule_skips_no_due_run() -> None:
    enqueuer = PeriodicEnqueuer()
    enqueuer.run_once(now=NOW)
    assert set_periodic_enabled(NAME, True, now=NOW + HOUR + timedelta(minutes=1)) is False
    assert row().last_run_at == NOW
    assert enqueuer.run_once(now=NOW + HOUR + timedelta(minutes=1)) == 1


@configured
def test_a_schedule_without_a_row_gets_one_when_disabled() -> None:
    assert set_periodic_enabled(NAME, False, now=NOW + timedelta(minutes=30)) is True
    assert (row().enabled, row().last_run_at, row().last_job_id) == (False, NOW, None)
    enqueuer = PeriodicEnqueuer()
    assert enqueuer.run_once(now=NOW + HOUR) == 0
    set_periodic_enabled(NAME, True, now=NOW + HOUR + timedelta(minutes=30))
    assert enqueuer.run_once(now=NOW + HOUR + timedelta(minutes=31)) == 0
    assert enqueuer.run_once(now=NOW + 2 * HOUR) == 1


@configured
def test_enabling_a_schedule_without_a_row_changes_nothing_but_makes_it() -> None:
    assert set_periodic_enabled(NAME, True, now=NOW + timedelta(minutes=30)) is False
    assert (row().enabled, row().last_run_at) == (True, NOW)


@configured
def test_each_enqueued_run_keeps_its_job_id() -> None:
    enqueuer = PeriodicEnqueuer()
    enqueuer.run_once(now=NOW)
    enqueuer.run_once(now=NOW + HOUR)
    first = Job.objects.get()
    assert row().last_job_id == first.pk
    enqueuer.run_once(now=NOW + 2 * HOUR)
    second = Job.objects.exclude(pk=first.pk).get()
    assert row().last_job_id == second.pk


@configured
def test_a_disabled_schedule_still_configured_is_never_forgotten() -> None:
    set_periodic_enabled(NAME, False, now=NOW)
    PeriodicSchedule.objects.filter(name=NAME).update(updated_at=NOW - timedelta(days=30))
    PeriodicEnqueuer().run_once(now=NOW + timedelta(days=3))
    assert row().enabled is False


@configured
def test_an_infinite_last_run_breaks_nothing() -> None:
    """A row edited by hand: its last run is no datetime Python can hold."""
    PeriodicSchedule.objects.create(name=NAME, last_run_at=NOW)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE eddyq_periodic SET last_run_at = 'infinity'")
    assert PeriodicEnqueuer().run_once(now=NOW + HOUR) == 0  # never again: it is past every run
    [status] = periodic_schedules(now=NOW)
    assert status.last_run_at is None
    with connection.cursor() as cursor:
        cursor.execute("UPDATE eddyq_periodic SET last_run_at = '-infinity'")
    assert PeriodicEnqueuer().run_once(now=NOW + HOUR) == 1  # every run is due: the latest


@pytest.mark.django_db(transaction=True)
@configured
def test_a_disable_committed_during_a_pass_is_honoured() -> None:
    """The pass read the schedule as enabled, then waits for its row's lock, held by the
    operator's disable; once that commits the pass enqueues nothing."""
    PeriodicEnqueuer().run_once(now=NOW)
    passes: list[int] = []

    def run_pass() -> None:
        try:
            passes.append(PeriodicEnqueuer().run_once(now=NOW + HOUR))
        finally:
            connections.close_all()

    enqueuer = threading.Thread(target=run_pass)
    with transaction.atomic():
        set_periodic_enabled(NAME, False, now=NOW + timedelta(minutes=59))
        enqueuer.start()
        deadline = time.monotonic() + 10
        with connection.cursor() as cursor:
            while True:
                cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                if cursor.fetchone()[0]:
                    break  # the pass waits for the row
                assert time.monotonic() < deadline, "the pass never waited for the row's lock"
                time.sleep(0.02)
    enqueuer.join(10)
    assert passes == [0]
    assert not Job.all_objects.exists()
    assert (row().enabled, row().last_run_at) == (False, NOW)


# Running one now.


@configured
def test_run_now_enqueues_one_manual_run_without_moving_the_schedule() -> None:
    enqueuer = PeriodicEnqueuer()
    enqueuer.run_once(now=NOW)
    enqueuer.run_once(now=NOW + HOUR)
    scheduled = Job.objects.get()
    job = run_periodic_now(NAME)
    assert (job.task, job.args, job.queue, job.priority, job.state) == (
        "tests.jobs.record",
        ["report"],
        "reports",
        5,
        Job.State.AVAILABLE,
    )
    assert job.metadata == {"periodic": NAME, "manual": True}
    assert Job.objects.get(pk=job.pk).metadata == {"periodic": NAME, "manual": True}
    assert (row().last_run_at, row().last_job_id) == (NOW + HOUR, scheduled.pk)
    assert enqueuer.run_once(now=NOW + HOUR + timedelta(minutes=5)) == 0
    assert enqueuer.run_once(now=NOW + 2 * HOUR) == 1


@configured
def test_run_now_works_while_disabled_and_without_a_row() -> None:
    job = run_periodic_now(NAME)
    assert Job.objects.filter(pk=job.pk).exists()
    assert not PeriodicSchedule.objects.exists()  # the enqueuer starts it as it would have
    set_periodic_enabled(NAME, False, now=NOW)
    assert run_periodic_now(NAME).pk != job.pk


@configured
@pytest.mark.parametrize(
    "call",
    [
        lambda name: run_periodic_now(name),
        lambda name: set_periodic_enabled(name, False),
        lambda name: set_periodic_enabled(name, True),
    ],
    ids=["run_periodic_now", "disable", "enable"],
)
def test_an_unknown_schedule_is_named_in_the_error(call: object) -> None:
    # A row whose schedule is no longer configured is unknown too.
    PeriodicSchedule.objects.create(name="retired", last_run_at=NOW)
    for name in ("no-such-schedule", "retired"):
        with pytest.raises(ScheduleNotFound, match=f"no periodic schedule '{name}'") as error:
            call(name)  # type: ignore[operator]
        assert isinstance(error.value, LookupError) and error.value.name == name
    assert not Job.all_objects.exists()
    assert list(PeriodicSchedule.objects.values_list("name", "enabled")) == [("retired", True)]


# Listing them.


@override_settings(
    EDDYQ={
        "PERIODIC": {
            **PERIODIC,
            "paris-morning": {
                "task": "tests.jobs.add",
                "cron": "0 9 * * *",
                "timezone": "Europe/Paris",
                "args": [1, 2],
            },
            "never-run": {"task": "tests.jobs.send_email", "cron": "30 * * * *", "args": ["x"]},
        }
    }
)
def test_the_list_shows_every_schedule_by_the_given_clock() -> None:
    @task(cron="*/5 * * * *", queue="ticks")
    def tick() -> None: ...

    try:
        enqueuer = PeriodicEnqueuer()
        enqueuer.run_once(now=NOW)
        enqueuer.run_once(now=NOW + HOUR)
        job = Job.objects.get(metadata__periodic=NAME)
        set_periodic_enabled("paris-morning", False, now=NOW + HOUR)
        PeriodicSchedule.objects.create(name="retired", last_run_at=NOW, last_job_id=12)
        PeriodicSchedule.objects.filter(name="never-run").delete()

        statuses = {status.name: status for status in periodic_schedules(now=NOW + 2 * HOUR)}
    finally:
        del SCHEDULED_TASKS[tick.path]
    assert list(statuses) == [*sorted([NAME, "never-run", "paris-morning", tick.path]), "retired"]
    # Its 14:00 run is due and not enqueued yet (no pass since): it is next.
    assert statuses[NAME] == ScheduleStatus(
        name=NAME,
        enabled=True,
        configured=True,
        task="tests.jobs.record",
        cron="0 * * * *",
        timezone="UTC",
        queue="reports",
        priority=5,
        next_run_at=NOW + 2 * HOUR,
        last_run_at=NOW + HOUR,
        last_job_id=job.pk,
    )
    never = statuses["never-run"]  # configured, no row: starts from its next run
    assert (never.queue, never.priority, never.enabled) == ("emails", 7, True)
    assert (never.next_run_at, never.last_run_at, never.last_job_id) == (
        NOW + 2 * HOUR + timedelta(minutes=30),
        None,
        None,
    )
    paris = statuses["paris-morning"]
    assert (paris.enabled, paris.next_run_at, paris.timezone) == (False, None, "Europe/Paris")
    assert statuses[tick.path].cron == "*/5 * * * *"
    assert statuses[tick.path].next_run_at == NOW + 2 * HOUR  # due, like the report's
    assert statuses["retired"] == ScheduleStatus(
        name="retired", enabled=True, configured=False, last_run_at=NOW, last_job_id=12
    )


def test_the_list_reads_the_database_clock_by_default() -> None:
    assert periodic_schedules() == []
    with override_settings(EDDYQ={"PERIODIC": PERIODIC}):
        [status] = periodic_schedules()
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    assert now < status.next_run_at <= now + HOUR


def test_the_api_is_exported_from_the_package() -> None:
    assert django_eddyq.run_periodic_now is run_periodic_now
    assert django_eddyq.set_periodic_enabled is set_periodic_enabled
    assert django_eddyq.periodic_schedules is periodic_schedules
