"""Single passes of the rescuer, the scheduler and the periodic enqueuer, with an injected now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings

from django_eddyq import task
from django_eddyq.maintenance import PeriodicEnqueuer, Rescuer, Scheduler
from django_eddyq.maintenance.periodic import PeriodicJob, periodic_jobs
from django_eddyq.models import Job, PeriodicSchedule
from django_eddyq.tasks import SCHEDULED_TASKS
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

# In the past of the database clock, so that runs enqueued "now" are available.
NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def running_job(**fields: object) -> Job:
    defaults: dict[str, object] = {
        "state": Job.State.RUNNING,
        "attempt": 1,
        "attempted_at": NOW - timedelta(minutes=5),
        "locked_by": "host:1:abc",
        "locked_until": NOW - timedelta(seconds=1),
        "heartbeat_at": NOW - timedelta(minutes=2),
    }
    job: Job = JobFactory(**{**defaults, **fields})
    return job


def seconds_from(moment: datetime, later: datetime | None) -> float:
    assert later is not None
    return (later - moment).total_seconds()


# Rescuer.


def test_rescuer_makes_an_expired_lease_retryable_with_the_tasks_backoff() -> None:
    job = running_job(task="tests.jobs.always_fails", attempt=2, max_attempts=3)

    assert Rescuer().run_once(now=NOW) == 1

    job.refresh_from_db()
    assert job.state == Job.State.RETRYABLE
    assert job.locked_by is None and job.locked_until is None
    assert seconds_from(NOW, job.run_at) == 20  # the task's backoff: 10s x attempt
    [entry] = job.errors
    assert entry["attempt"] == 2
    assert entry["error"].startswith("JobRescued: worker host:1:abc stopped renewing")
    assert entry["rescued_from"] == "host:1:abc"
    assert entry["at"]


def test_rescuer_uses_the_default_backoff_for_unknown_tasks() -> None:
    job = running_job(task="no.such.task", attempt=3)
    Rescuer().run_once(now=NOW)
    job.refresh_from_db()
    assert 81 * 0.9 <= seconds_from(NOW, job.run_at) <= 81 * 1.1


def test_rescuer_fails_a_job_that_used_its_attempts() -> None:
    job = running_job(attempt=3, max_attempts=3)
    Rescuer().run_once(now=NOW)
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert job.finalized_at == NOW
    assert job.errors[-1]["error"].startswith("JobRescued")


def test_the_lease_decides_not_the_jobs_age() -> None:
    old_but_alive = running_job(
        attempted_at=NOW - timedelta(days=3), locked_until=NOW + timedelta(seconds=1)
    )
    exactly_at_deadline = running_job(locked_until=NOW)
    assert Rescuer().run_once(now=NOW) == 0
    old_but_alive.refresh_from_db()
    exactly_at_deadline.refresh_from_db()
    assert old_but_alive.state == exactly_at_deadline.state == Job.State.RUNNING
    assert Rescuer().run_once(now=NOW + timedelta(microseconds=1)) == 1


def test_rescuer_leaves_other_states_alone() -> None:
    for state in ("available", "scheduled", "retryable", "completed", "failed", "cancelled"):
        JobFactory(state=state, locked_until=NOW - timedelta(hours=1))
    assert Rescuer().run_once(now=NOW) == 0


def test_rescuer_handles_more_jobs_than_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("django_eddyq.maintenance.rescuer.RESCUE_BATCH", 3)
    for _ in range(7):
        running_job()
    assert Rescuer().run_once(now=NOW) == 7
    assert not Job.objects.filter(state=Job.State.RUNNING).exists()


# Scheduler.


def test_scheduler_promotes_due_scheduled_and_retryable_jobs() -> None:
    due_scheduled = JobFactory(state=Job.State.SCHEDULED, run_at=NOW - timedelta(seconds=1))
    due_retryable = JobFactory(state=Job.State.RETRYABLE, run_at=NOW, attempt=1)
    not_yet = JobFactory(state=Job.State.SCHEDULED, run_at=NOW + timedelta(microseconds=1))

    assert Scheduler().run_once(now=NOW) == 2

    states = dict(Job.objects.values_list("id", "state"))
    assert states[due_scheduled.pk] == states[due_retryable.pk] == Job.State.AVAILABLE
    assert states[not_yet.pk] == Job.State.SCHEDULED


def test_scheduler_wakes_for_the_next_due_job_capped_by_its_interval() -> None:
    scheduler = Scheduler()
    assert scheduler.next_delay(5.0) == 5.0  # nothing scheduled
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        db_now = cursor.fetchone()[0]
    JobFactory(state=Job.State.SCHEDULED, run_at=db_now + timedelta(seconds=1))
    assert 0.9 < scheduler.next_delay(5.0) <= 1.01
    JobFactory(state=Job.State.RETRYABLE, run_at=db_now - timedelta(seconds=10))
    assert scheduler.next_delay(5.0) < 0.01  # overdue: at once


def test_scheduler_notifies_the_queues_it_fills() -> None:
    # The notification is sent on commit; here it is enough that the statement asks for it.
    JobFactory(state=Job.State.SCHEDULED, queue="q1", run_at=NOW - timedelta(seconds=1))
    with connection.cursor() as cursor:
        from django_eddyq import sql

        cursor.execute(sql.PROMOTE_DUE_ANY_QUEUE, {"now": NOW, "limit": 10})
        promoted, notified = cursor.fetchone()
    assert (promoted, notified) == (1, 1)


# Periodic enqueuer.

PERIODIC = {
    "hourly-report": {
        "task": "tests.jobs.record",
        "cron": "0 * * * *",
        "args": ["report"],
        "queue": "reports",
        "priority": 5,
    },
}


@override_settings(EDDYQ={"PERIODIC": PERIODIC})
def test_a_new_schedule_starts_from_its_next_run() -> None:
    assert PeriodicEnqueuer().run_once(now=NOW + timedelta(minutes=30)) == 0
    assert PeriodicSchedule.objects.get(name="hourly-report").last_run_at == NOW
    assert not Job.objects.exists()


@override_settings(EDDYQ={"PERIODIC": PERIODIC})
def test_each_run_is_enqueued_once_with_run_at_its_scheduled_time() -> None:
    enqueuer = PeriodicEnqueuer()
    enqueuer.run_once(now=NOW)
    assert enqueuer.run_once(now=NOW + timedelta(minutes=59, seconds=59)) == 0
    assert enqueuer.run_once(now=NOW + timedelta(hours=1)) == 1  # exactly on time
    assert enqueuer.run_once(now=NOW + timedelta(hours=1, minutes=1)) == 0

    [job] = Job.objects.all()
    assert job.run_at == NOW + timedelta(hours=1)
    assert (job.task, job.args, job.queue, job.priority) == (
        "tests.jobs.record",
        ["report"],
        "reports",
        5,
    )
    assert job.state == Job.State.AVAILABLE
    assert job.metadata["periodic"] == "hourly-report"


@override_settings(EDDYQ={"PERIODIC": PERIODIC})
def test_a_second_leader_never_enqueues_the_same_run() -> None:
    PeriodicEnqueuer().run_once(now=NOW)
    first, second = PeriodicEnqueuer(), PeriodicEnqueuer()
    assert first.run_once(now=NOW + timedelta(hours=1)) == 1
    assert second.run_once(now=NOW + timedelta(hours=1)) == 0
    # Even once the job of that run was deleted (say, by the cleaner).
    Job.all_objects.all().delete()
    assert second.run_once(now=NOW + timedelta(hours=1, minutes=5)) == 0
    assert not Job.all_objects.exists()


@override_settings(EDDYQ={"PERIODIC": PERIODIC})
def test_runs_missed_without_a_leader_enqueue_only_the_latest() -> None:
    PeriodicEnqueuer().run_once(now=NOW)
    assert PeriodicEnqueuer().run_once(now=NOW + timedelta(hours=5, minutes=10)) == 1
    [job] = Job.objects.all()
    assert job.run_at == NOW + timedelta(hours=5)


@override_settings(
    EDDYQ={
        "PERIODIC": {
            "paris-morning": {
                "task": "tests.jobs.add",
                "cron": "0 9 * * *",
                "timezone": "Europe/Paris",
                "args": [1, 2],
            },
            "every-10s": {"task": "tests.jobs.add", "cron": "* * * * * */10", "args": [1, 1]},
        }
    }
)
def test_timezones_and_seconds_fields() -> None:
    enqueuer = PeriodicEnqueuer()
    enqueuer.run_once(now=NOW)
    assert enqueuer.run_once(now=NOW + timedelta(seconds=10)) == 1
    # 09:00 in Paris in June is 07:00 UTC; the every-10s schedule is due then too.
    seven_utc = datetime(2025, 6, 2, 7, 0, tzinfo=UTC)
    assert enqueuer.run_once(now=seven_utc) == 2
    runs = sorted(Job.objects.values_list("metadata__periodic", "run_at"))
    assert runs == [
        ("every-10s", NOW + timedelta(seconds=10)),
        ("every-10s", seven_utc),
        ("paris-morning", seven_utc),
    ]


def test_cron_on_the_decorator_is_a_schedule() -> None:
    @task(cron="*/5 * * * *", queue="ticks", priority=3, max_attempts=2, retention={"completed": 0})
    def tick() -> None: ...

    try:
        [schedule] = [s for s in periodic_jobs() if s.name == tick.path]
        assert (schedule.task, schedule.cron, schedule.queue) == (tick.path, "*/5 * * * *", "ticks")
        enqueuer = PeriodicEnqueuer()
        enqueuer.run_once(now=NOW)
        assert enqueuer.run_once(now=NOW + timedelta(minutes=5)) == 1
        job = Job.all_objects.get()
        assert (job.task, job.queue, job.priority, job.max_attempts, job.retention) == (
            tick.path,
            "ticks",
            3,
            2,
            {"completed": 0.0},
        )
    finally:
        del SCHEDULED_TASKS[tick.path]


def test_an_invalid_cron_on_the_decorator_is_refused() -> None:
    with pytest.raises(ValueError, match="cron expression '61 \\* \\* \\* \\*' is invalid"):

        @task(cron="61 * * * *")
        def never() -> None: ...


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task": "tests.jobs.add", "cron": "nope"}, "cron expression 'nope' is invalid"),
        ({"cron": "* * * * *"}, "must be the dotted path of a task"),
        (
            {"task": "tests.jobs.add", "cron": "* * * * *", "timezone": "Mars/Olympus"},
            "unknown timezone",
        ),
        ({"task": "tests.jobs.add", "cron": "* * * * *", "priority": 500}, "priority"),
        ({"task": "tests.jobs.add", "cron": "* * * * *", "every": "day"}, "unknown keys: every"),
        ({"task": "tests.jobs.add", "cron": "* * * * *", "args": [object()]}, "argument 0"),
    ],
)
def test_invalid_periodic_settings_name_the_problem(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as error:
        PeriodicJob.from_setting("bad", options)
    assert "EDDYQ[\"PERIODIC\"]['bad']" in str(error.value)


@override_settings(EDDYQ={"PERIODIC": PERIODIC})
def test_the_enqueuer_sleeps_until_the_next_run() -> None:
    enqueuer = PeriodicEnqueuer()
    assert enqueuer.interval() == 60.0
    assert 0 <= enqueuer.next_delay(60.0) <= 60.0


def test_the_enqueuer_is_disabled_without_schedules() -> None:
    assert PeriodicEnqueuer().interval() is None


@override_settings(
    EDDYQ={
        "PERIODIC": {
            "emails": {
                "task": "tests.jobs.send_email",
                "cron": "0 * * * *",
                "args": ["x@example.com"],
            }
        }
    }
)
def test_a_periodic_entry_takes_its_tasks_options_as_defaults() -> None:
    enqueuer = PeriodicEnqueuer()
    enqueuer.run_once(now=NOW)
    enqueuer.run_once(now=NOW + timedelta(hours=1))
    job = Job.objects.get()
    assert (job.queue, job.priority, job.max_attempts) == ("emails", 7, 4)


@override_settings(
    EDDYQ={
        "PERIODIC": {
            "broken": {"task": "tests.jobs.add", "cron": "not a cron"},
            "fine": {"task": "tests.jobs.add", "cron": "0 * * * *", "args": [1, 2]},
        }
    }
)
def test_one_invalid_schedule_does_not_stop_the_others() -> None:
    enqueuer = PeriodicEnqueuer()
    assert enqueuer.interval() == 60.0
    enqueuer.run_once(now=NOW)
    assert enqueuer.run_once(now=NOW + timedelta(hours=1)) == 1


def test_schedules_gone_from_the_configuration_are_forgotten_after_a_day() -> None:
    PeriodicSchedule.objects.create(name="removed", last_run_at=NOW)
    PeriodicSchedule.objects.filter(name="removed").update(updated_at=NOW)
    PeriodicEnqueuer().run_once(now=NOW + timedelta(hours=23))
    assert PeriodicSchedule.objects.filter(name="removed").exists()
    PeriodicEnqueuer().run_once(now=NOW + timedelta(days=1, seconds=1))
    assert not PeriodicSchedule.objects.filter(name="removed").exists()
