"""``manage.py eddyq``: run as an operator runs it, a subprocess against real PostgreSQL; its
tables, its JSON, its exit statuses."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from django_eddyq import Workflow
from django_eddyq.election import ELECTION
from django_eddyq.maintenance.periodic import set_periodic_enabled
from django_eddyq.models import Job, Leader, PeriodicSchedule, Queue, WorkerProcess, WorkflowRun
from django_eddyq.testing import run_jobs
from tests import jobs
from tests.factories import JobFactory, QueueFactory
from tests.processes import MANAGE, StartWorker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def eddyq(worker_environment: dict[str, str]) -> Any:
    """Runs ``manage.py eddyq ARGS`` and returns the finished process (text output)."""

    def run(*arguments: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(MANAGE), "eddyq", *arguments],
            env=worker_environment,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def live_worker(worker_id: str = "web-1:11:abc", *, leader: bool = True) -> WorkerProcess:
    worker = WorkerProcess.objects.create(
        id=worker_id,
        host=worker_id.split(":")[0],
        pid=11,
        version="0.1.0",
        queues=None,
        concurrency=10,
        running=2,
        leader=leader,
    )
    if leader:
        now = timezone.now()
        Leader.objects.create(
            name=ELECTION, leader_id=worker_id, elected_at=now, expires_at=now + timedelta(hours=1)
        )
    return worker


# status


def test_status_of_a_healthy_queue(eddyq: Any) -> None:
    JobFactory.create_batch(3)
    JobFactory(
        queue="emails", state=Job.State.SCHEDULED, run_at=timezone.now() + timedelta(hours=1)
    )
    JobFactory(failed=True)
    JobFactory(state=Job.State.PENDING)  # a workflow's step waiting for others
    # Enqueues keep a row per queue; the factories do not.
    for name in ("default", "emails"):
        QueueFactory(name=name)
    QueueFactory(name="reports", paused_at=timezone.now())
    live_worker()

    result = eddyq("status")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("QUEUE"))
    assert header.split() == [
        "QUEUE", "PAUSED", "PENDING", "AVAILABLE", "SCHEDULED", "RUNNING", "RETRYABLE",
        "COMPLETED", "FAILED", "CANCELLED", "OLDEST", "DUE", "COMPLETED", "1/5/15M", "FAILED",
        "1/5/15M",
    ]  # fmt: skip
    default = next(line for line in lines if line.startswith("default"))
    assert default.split()[:10] == ["default", "no", "1", "3", "0", "0", "0", "0", "1", "0"]
    assert next(line for line in lines if line.startswith("reports")).split()[1] == "yes"
    assert "Leader: web-1:11:abc" in result.stdout and "(active)" in result.stdout
    assert "Workers: 1 running, 0 lost, 0 stopped" in result.stdout
    assert "Unhealthy" not in result.stdout


def test_status_as_json(eddyq: Any) -> None:
    JobFactory.create_batch(2, run_at=timezone.now() - timedelta(minutes=5))
    QueueFactory(name="default")
    live_worker()
    result = eddyq("status", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["healthy"] is True and data["problems"] == []
    [default] = [queue for queue in data["queues"] if queue["name"] == "default"]
    assert default["jobs"]["available"] == 2
    assert default["estimated"] == []
    assert 290 < default["oldest_due_seconds"] < 900
    assert data["leader"]["worker"] == "web-1:11:abc" and data["leader"]["active"] is True
    [worker] = data["workers"]
    assert (worker["id"], worker["status"], worker["running"]) == ("web-1:11:abc", "running", 2)


def test_status_shows_the_jobs_finished_lately(eddyq: Any) -> None:
    from django_eddyq.models import Activity

    QueueFactory(name="default")
    QueueFactory(name="idle")
    live_worker()
    minute = timezone.now().replace(second=0, microsecond=0)
    for minutes_ago, completed, failed in ((0, 1, 0), (1, 2, 1), (4, 30, 0), (14, 400, 5)):
        Activity.objects.create(
            minute=minute - timedelta(minutes=minutes_ago),
            queue="default",
            source="w1",
            completed=completed,
            failed=failed,
        )
    Activity.objects.create(minute=minute - timedelta(minutes=20), queue="idle", source="w1")
    result = eddyq("status")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The minute may have turned since the rows were written: the previous minute's then falls
    # out of the last 1 minute.
    default = next(line for line in lines if line.startswith("default")).split()
    assert default[-2] in ("3/33/433", "1/33/433") and default[-1] in ("1/1/6", "0/1/6")
    assert next(line for line in lines if line.startswith("idle")).split()[-2:] == [
        "0/0/0",
        "0/0/0",
    ]
    data = json.loads(eddyq("status", "--json").stdout)
    [queue] = [queue for queue in data["queues"] if queue["name"] == "default"]
    assert set(queue["completed_recently"]) == {"1m", "5m", "15m"}
    assert set(queue["failed_recently"]) == {"1m", "5m", "15m"}
    assert queue["completed_recently"]["15m"] >= 33


def test_status_exits_1_without_a_running_worker_or_a_leader(eddyq: Any) -> None:
    lost = live_worker(leader=False)
    WorkerProcess.objects.filter(pk=lost.pk).update(last_seen_at=Now() - timedelta(hours=1))
    result = eddyq("status")
    assert result.returncode == 1
    assert "Workers: 0 running, 1 lost" in result.stdout
    assert "Unhealthy: no worker is running" in result.stdout
    assert "Unhealthy: no leader holds the lease" in result.stdout
    data = json.loads(eddyq("status", "--json").stdout)
    assert data["healthy"] is False and len(data["problems"]) == 2


def test_status_watch_repeats_until_interrupted(worker_environment: dict[str, str]) -> None:
    live_worker()
    # A child inherits SIGINT ignored (as in a test run started in the background of a
    # non-interactive shell), and Python then never turns it into KeyboardInterrupt; a signal
    # this process handles is at its default in the child.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, str(MANAGE), "eddyq", "status", "--json", "--watch", "0.2"],
            env=worker_environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert process.stdout is not None
    documents = [json.loads(process.stdout.readline()) for _ in range(2)]
    process.send_signal(signal.SIGINT)
    assert process.wait(30) == 0
    assert all(document["healthy"] for document in documents)
    assert documents[0]["now"] < documents[1]["now"]


def test_watch_refuses_a_silly_interval(eddyq: Any) -> None:
    result = eddyq("status", "--watch", "0")
    assert result.returncode == 2
    assert "give 0.1 to 3600 seconds" in result.stderr


# job ID


def test_job_shows_every_attempt_with_its_traceback(eddyq: Any) -> None:
    job = JobFactory(
        failed=True,
        attempt=2,
        attempted_by="web-1:11:abc",
        kwargs={"to": "ada@example.com"},
        metadata={"origin": "signup"},
        errors=[
            {"attempt": 1, "at": "2026-11-25T10:00:00+00:00", "error": "TimeoutError: slow",
             "worker": "web-1:11:abc", "traceback": "Traceback (most recent call last):\n  x\n"},
            {"attempt": 2, "at": "2026-11-25T10:01:00+00:00", "error": "ValueError: boom",
             "rescued_from": "web-2:22:def"},
            "an entry of another shape",
        ],
    )  # fmt: skip
    result = eddyq("job", str(job.pk))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"Job {job.pk}: tests.jobs.add (failed)" in out
    assert "attempt               2 of 25" in out
    assert 'kwargs                {"to": "ada@example.com"}' in out
    assert "deleted by retention  20" in out
    assert "attempt 1 · 2026-11-25T10:00:00+00:00 · web-1:11:abc · TimeoutError: slow" in out
    assert "      Traceback (most recent call last):" in out
    assert "attempt 2 · 2026-11-25T10:01:00+00:00 · rescued from web-2:22:def" in out
    assert '3. "an entry of another shape"' in out

    data = json.loads(eddyq("job", str(job.pk), "--json").stdout)
    assert data["id"] == job.pk and data["state"] == "failed"
    assert data["kwargs"] == {"to": "ada@example.com"}
    assert data["errors"][0]["traceback"].startswith("Traceback")
    assert data["deleted_at"] is not None and data["kept_forever"] is False


def test_a_job_that_is_not_there_exits_1(eddyq: Any) -> None:
    result = eddyq("job", "987654321")
    assert result.returncode == 1
    assert "No job 987654321" in result.stderr


@pytest.mark.parametrize("argument", ["x", "-3", "0", "99999999999999999999"])
def test_job_refuses_what_is_not_an_id(eddyq: Any, argument: str) -> None:
    result = eddyq("job", "--", argument)
    assert result.returncode == 2
    assert "is not a job id" in result.stderr


# pause, resume


def test_pause_and_resume_queues(eddyq: Any) -> None:
    QueueFactory(name="emails")
    result = eddyq("pause", "emails", "reports")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["Queue emails paused.", "Queue reports paused."]
    assert set(Queue.objects.filter(paused_at__isnull=False).values_list("name", flat=True)) == {
        "emails",
        "reports",
    }
    result = eddyq("resume", "emails", "--json")
    assert json.loads(result.stdout) == {"queues": ["emails"], "paused": False}
    assert Queue.objects.get(name="emails").paused_at is None


def test_a_bad_queue_name_is_bad_usage(eddyq: Any) -> None:
    result = eddyq("pause", "no spaces!")
    assert result.returncode == 2
    assert "queue name 'no spaces!' is invalid" in result.stderr


def test_no_subcommand_is_bad_usage(eddyq: Any) -> None:
    result = eddyq()
    assert result.returncode == 2
    assert "SUBCOMMAND" in result.stderr


def test_every_subcommand_has_help(eddyq: Any) -> None:
    for subcommand in (
        "status",
        "job",
        "jobs",
        "retry",
        "cancel",
        "delete",
        "pause",
        "resume",
        "periodic",
        "workflow",
    ):
        result = eddyq(subcommand, "--help")
        assert result.returncode == 0
        assert "--json" in result.stdout


# periodic

# Their tasks are declared as tests.jobs is imported (the subprocess has it in TASK_MODULES).
SCHEDULES = {
    "hourly-report": {
        "task": jobs.record.path,
        "cron": "0 * * * *",
        "args": ["report"],
        "queue": "reports",
        "priority": 5,
    },
    "paris-digest": {
        "task": jobs.send_email.path,
        "cron": "0 8 * * 1-5",
        "timezone": "Europe/Paris",
        "args": ["team@example.com"],
    },
}


@pytest.fixture
def eddyq_periodic(worker_environment: dict[str, str]) -> Any:
    """``manage.py eddyq periodic ARGS`` in a project whose ``EDDYQ["PERIODIC"]`` is
    ``SCHEDULES``; the test's own calls see them too."""
    environment = {**worker_environment, "TESTPROJECT_PERIODIC": json.dumps(SCHEDULES)}

    def run(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(MANAGE), "eddyq", "periodic", *arguments],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )

    with override_settings(EDDYQ={"PERIODIC": SCHEDULES}):
        yield run


def test_periodic_lists_the_schedules(eddyq_periodic: Any) -> None:
    job = JobFactory(task="tests.jobs.record", queue="reports")
    last_run = timezone.now().replace(minute=0, second=0, microsecond=0)
    PeriodicSchedule.objects.create(name="hourly-report", last_run_at=last_run, last_job_id=job.pk)
    set_periodic_enabled("paris-digest", False)
    PeriodicSchedule.objects.create(name="retired", last_run_at=last_run)

    result = eddyq_periodic()
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    assert header.split() == [
        "NAME", "TASK", "CRON", "TIME", "ZONE", "QUEUE", "STATUS", "NEXT", "RUN", "LAST", "RUN",
        "LAST", "JOB",
    ]  # fmt: skip
    report, digest, retired = (line.split() for line in lines)
    next_run = (last_run + timedelta(hours=1)).strftime("%Y-%m-%d")
    assert report[:9] == [
        "hourly-report", "tests.jobs.record", "0", "*", "*", "*", "*", "UTC", "reports",
    ]  # fmt: skip
    assert report[9] == "enabled" and report[10] == next_run and report[-1] == str(job.pk)
    assert digest[0] == "paris-digest" and "Europe/Paris" in digest and "disabled" in digest
    assert retired[:3] == ["retired", "—", "—"] and "configured" in retired

    data = json.loads(eddyq_periodic("--json").stdout)
    schedules = {schedule["name"]: schedule for schedule in data["schedules"]}
    assert list(schedules) == ["hourly-report", "paris-digest", "retired"]
    assert schedules["hourly-report"] == {
        "name": "hourly-report",
        "enabled": True,
        "configured": True,
        "task": "tests.jobs.record",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "queue": "reports",
        "priority": 5,
        "next_run_at": (last_run + timedelta(hours=1)).isoformat(),
        "last_run_at": last_run.isoformat(),
        "last_job_id": job.pk,
    }
    assert schedules["paris-digest"]["enabled"] is False
    assert schedules["paris-digest"]["next_run_at"] is None
    assert schedules["retired"]["configured"] is False


def test_periodic_run_enqueues_one_run_now(eddyq_periodic: Any) -> None:
    result = eddyq_periodic("run", "hourly-report")
    assert result.returncode == 0, result.stderr
    job = Job.objects.get()
    assert result.stdout.strip() == f"Enqueued job {job.pk}: a run of hourly-report now."
    assert (job.task, job.args, job.queue, job.priority) == (
        "tests.jobs.record",
        ["report"],
        "reports",
        5,
    )
    assert job.metadata == {"periodic": "hourly-report", "manual": True}
    assert not PeriodicSchedule.objects.exists()  # its cron position is the enqueuer's

    data = json.loads(eddyq_periodic("run", "paris-digest", "--json").stdout)
    assert data == {"schedule": "paris-digest", "job_id": data["job_id"]}
    assert Job.objects.get(pk=data["job_id"]).task == "tests.jobs.send_email"


def test_periodic_disable_and_enable(eddyq_periodic: Any) -> None:
    result = eddyq_periodic("disable", "paris-digest")
    assert (result.returncode, result.stdout.strip()) == (0, "Schedule paris-digest disabled.")
    assert PeriodicSchedule.objects.get(name="paris-digest").enabled is False
    result = eddyq_periodic("disable", "paris-digest")
    assert result.stdout.strip() == "Schedule paris-digest was already disabled."
    data = json.loads(eddyq_periodic("enable", "paris-digest", "--json").stdout)
    assert data == {"schedule": "paris-digest", "enabled": True, "changed": True}
    assert PeriodicSchedule.objects.get(name="paris-digest").enabled is True


@pytest.mark.parametrize("arguments", [("run", "nope"), ("enable", "nope"), ("disable", "nope")])
def test_periodic_exits_1_for_an_unknown_schedule(
    eddyq_periodic: Any, arguments: tuple[str, ...]
) -> None:
    result = eddyq_periodic(*arguments)
    assert result.returncode == 1
    assert "No periodic schedule 'nope' is configured" in result.stderr
    assert not Job.objects.exists() and not PeriodicSchedule.objects.exists()


def test_periodic_exits_1_without_schedules(eddyq: Any) -> None:
    result = eddyq("periodic")
    assert result.returncode == 1
    assert "No periodic schedules" in result.stderr
    result = eddyq("periodic", "--json")
    assert (result.returncode, json.loads(result.stdout)) == (1, {"schedules": []})


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("run",), "periodic run needs the NAME of a schedule"),
        (("frobnicate", "hourly-report"), "invalid choice: 'frobnicate'"),
    ],
)
def test_periodic_bad_usage_exits_2(
    eddyq_periodic: Any, arguments: tuple[str, ...], message: str
) -> None:
    result = eddyq_periodic(*arguments)
    assert result.returncode == 2
    assert message in result.stderr


# jobs


def test_jobs_lists_the_newest_matching_jobs(eddyq: Any) -> None:
    old = JobFactory(failed=True, queue="emails", created_at=timezone.now() - timedelta(days=3))
    new = JobFactory(failed=True, queue="emails", task="tests.jobs.send_email")
    JobFactory(finished=True, queue="emails")
    JobFactory(failed=True, queue="reports")

    result = eddyq("jobs", "--state", "failed", "--queue", "emails")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == [
        "ID", "TASK", "STATE", "QUEUE", "ATTEMPT", "CREATED", "FINISHED", "LAST", "ERROR"
    ]  # fmt: skip
    assert [row.split()[0] for row in rows] == [str(new.pk), str(old.pk)]  # newest first
    assert rows[0].split()[1:5] == ["tests.jobs.send_email", "failed", "emails", "1/25"]
    assert rows[0].endswith("ValueError: boom")

    assert (
        eddyq("jobs", "--since", "1d", "--queue", "emails", "--state", "failed").stdout.count(
            "failed"
        )
        == 1
    )
    until = eddyq("jobs", "--until", "1d")
    assert [row.split()[0] for row in until.stdout.splitlines()[1:]] == [str(old.pk)]

    limited = eddyq("jobs", "--limit", "1")
    assert "First 1 shown, newest first; more match" in limited.stdout

    data = json.loads(eddyq("jobs", "--search", "send_email", "--json").stdout)
    assert [job["id"] for job in data["jobs"]] == [new.pk]
    assert data["jobs"][0]["last_error"] == "ValueError: boom" and data["more"] is False


def test_jobs_exits_1_when_nothing_matches(eddyq: Any) -> None:
    JobFactory(failed=True)
    result = eddyq("jobs", "--queue", "nothing-here")
    assert result.returncode == 1
    assert "No jobs of queue nothing-here." in result.stderr
    assert json.loads(eddyq("jobs", "--state", "running", "--json").stdout)["jobs"] == []


@pytest.mark.parametrize(
    "arguments",
    [["--state", "lost"], ["--since", "yesterday"], ["--limit", "0"], ["--queue", "a b"]],
)
def test_jobs_refuses_bad_filters(eddyq: Any, arguments: list[str]) -> None:
    assert eddyq("jobs", *arguments).returncode == 2


# retry, cancel, delete


def test_retry_by_ids(eddyq: Any) -> None:
    failed, completed = JobFactory(failed=True), JobFactory(finished=True)
    result = eddyq("retry", str(failed.pk), str(completed.pk), "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Retried 1 of 2 matching jobs; 1 left alone by the rule")
    assert Job.objects.get(pk=failed.pk).state == "available"
    assert Job.objects.get(pk=completed.pk).state == "completed"


def test_a_bulk_change_needs_ids_a_filter_or_all(eddyq: Any) -> None:
    JobFactory(failed=True)
    for subcommand in ("retry", "cancel", "delete"):
        result = eddyq(subcommand, "--yes")
        assert result.returncode == 2
        assert "or --all" in result.stderr
    result = eddyq("retry", "--all", "--yes", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["changed"] == 1


def test_without_a_terminal_a_bulk_change_is_refused_unless_yes(eddyq: Any) -> None:
    job = JobFactory(failed=True)
    result = eddyq("delete", "--state", "failed", stdin="y\n")
    assert result.returncode == 2
    assert "Delete 1 jobs in state failed?" in result.stderr
    assert "stdin is not a terminal. Add --yes" in result.stderr
    assert Job.objects.filter(pk=job.pk).exists()


def test_a_dry_run_counts_and_shows_a_sample(eddyq: Any) -> None:
    jobs = [JobFactory(state=Job.State.AVAILABLE) for _ in range(3)]
    running = JobFactory(state=Job.State.RUNNING, attempt=1, locked_by="w")
    ended = JobFactory(finished=True)
    result = eddyq("cancel", "--all", "--dry-run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "Dry run: would cancel 4 of 5 matching jobs (1 running: their workers are asked to "
        "stop); 1 left alone by the rule"
    )
    assert lines[1] == "Would change: " + ", ".join(
        f"#{pk}" for pk in sorted([*(job.pk for job in jobs), running.pk])
    )
    assert not Job.objects.filter(state="cancelled").exists()
    assert Job.objects.get(pk=ended.pk).state == "completed"


def test_bulk_changes_exit_1_when_nothing_matches(eddyq: Any) -> None:
    for subcommand in ("retry", "cancel", "delete"):
        result = eddyq(subcommand, "--queue", "nothing-here", "--yes")
        assert result.returncode == 1
        assert "No jobs of queue nothing-here." in result.stderr
    result = eddyq("delete", "987654321", "--yes", "--json")
    assert result.returncode == 1 and json.loads(result.stdout)["matched"] == 0


def test_cancel_and_delete_summaries_as_json(eddyq: Any) -> None:
    waiting = JobFactory.create_batch(3)
    JobFactory(finished=True)
    cancelled = json.loads(eddyq("cancel", "--state", "available", "--yes", "--json").stdout)
    assert (cancelled["matched"], cancelled["changed"], cancelled["skipped"]) == (3, 3, 0)
    assert cancelled["sample"] == [job.pk for job in waiting] and cancelled["done"] is True
    deleted = json.loads(eddyq("delete", "--all", "--yes", "--json", "--batch-size", "2").stdout)
    assert (deleted["matched"], deleted["changed"]) == (4, 4)
    assert not Job.all_objects.exists()


def test_a_batched_retry_while_a_worker_runs_loses_and_repeats_no_job(
    eddyq: Any, start_worker: StartWorker, worker_environment: dict[str, str]
) -> None:
    """20,000 failed jobs retried in batches of 500 while a worker claims them as they come
    back: each runs exactly once more, and ends completed at its second attempt."""
    from django.db import connection

    from demo.models import Execution

    jobs = 20_000
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO eddyq_jobs (task, args, kwargs, queue, priority, state, attempt,
                                    max_attempts, run_at, created_at, finalized_at, errors,
                                    metadata)
            SELECT 'tests.jobs.record_execution', '[0]', '{}', 'default', 0, 'failed', 1, 1,
                   now(), now(), now(), '[{"attempt": 1, "error": "ValueError: boom"}]', '{}'
            FROM generate_series(1, %s)
            """,
            [jobs],
        )
        cursor.execute("UPDATE eddyq_jobs SET args = jsonb_build_array(id)")
    # Handlers keep their connections, as docs/worker.md advises: a new one per job would
    # make the drain five times as long.
    worker_environment["DATABASE_URL"] += "?conn_max_age=600"
    worker = start_worker("--concurrency", "8")

    result = eddyq("retry", "--state", "failed", "--yes", "--json", "--batch-size", "500")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["matched"], summary["changed"]) == (jobs, jobs)

    wait_for(lambda: Job.objects.filter(state="completed").count() == jobs, seconds=240)
    assert worker.poll() is None
    assert Job.objects.exclude(state="completed").count() == 0
    assert set(Job.objects.values_list("attempt", "max_attempts").distinct()) == {(2, 2)}
    runs = Execution.objects.values_list("job_id", flat=True)
    assert len(runs) == jobs and set(runs) == set(Job.objects.values_list("pk", flat=True))


# workflow


def failed_workflow() -> Workflow:
    """fetch, then load (which fails), then report after load and notify after load whatever
    happened."""
    workflow = Workflow("nightly")
    fetch = workflow.add(jobs.workflow_step.s("fetch"), name="fetch")
    load = workflow.add(
        jobs.workflow_step.using(max_attempts=1).s("load", fail=True), after=[fetch], name="load"
    )
    workflow.add(jobs.workflow_step.s("report"), after=[load], name="report")
    workflow.add(
        jobs.workflow_step.s("notify"), after=[fetch, load], ignore_failure=True, name="notify"
    )
    workflow.enqueue()
    for _ in range(3):
        run_jobs()
    return workflow


def test_workflow_shows_its_steps(eddyq: Any) -> None:
    workflow = failed_workflow()
    fetch, load, report, notify = workflow.steps
    result = eddyq("workflow", str(workflow.id))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"Workflow {workflow.id}: nightly (failed)"
    assert lines[1] == "  steps      4: 0 not ended, 2 failed or cancelled"
    header = lines.index(next(line for line in lines if line.startswith("STEP")))
    assert lines[header].split() == ["STEP", "JOB", "STATE", "ATTEMPT", "DURATION", "AFTER"]
    # By job id: each step after those it runs after.
    rows = {row[0]: row[1:] for row in (line.split(None, 5) for line in lines[header + 1 :])}
    assert list(rows) == sorted(rows, key=lambda name: int(rows[name][0]))
    assert rows == {
        "fetch": [str(fetch.job_id), "completed", "1/3", rows["fetch"][3], "—"],
        "load": [str(load.job_id), "failed", "1/1", rows["load"][3], "fetch"],
        "report": [str(report.job_id), "cancelled", "0/3", "—", "load"],
        "notify": [
            str(notify.job_id),
            "completed",
            "1/3",
            rows["notify"][3],
            "fetch (any outcome), load (any outcome)",
        ],
    }
    assert rows["load"][3].endswith("s")  # its duration

    data = json.loads(eddyq("workflow", str(workflow.id), "--json").stdout)
    assert (data["id"], data["name"], data["state"]) == (workflow.id, "nightly", "failed")
    assert data["counts"] == {"steps": 4, "unfinished": 0, "failed": 2}
    assert data["more"] is False and data["retention"] == 7 * 24 * 3600
    by_name = {step["name"]: step for step in data["steps"]}
    assert by_name["load"]["state"] == "failed" and by_name["load"]["attempt"] == 1
    assert by_name["notify"]["after"] == [
        {"step": "fetch", "job_id": fetch.job_id, "ignore_failure": True},
        {"step": "load", "job_id": load.job_id, "ignore_failure": True},
    ]


def test_workflow_lists_at_most_limit_steps_and_their_every_dependency(eddyq: Any) -> None:
    workflow = Workflow("wide")
    first = workflow.add(jobs.workflow_step.s("first"), name="first")
    parts = [workflow.add(jobs.workflow_step.s(str(n)), after=[first]) for n in range(3)]
    workflow.add(jobs.workflow_step.s("last"), after=parts, name="last")
    workflow.enqueue()
    result = eddyq("workflow", str(workflow.id), "--limit", "2")
    assert result.returncode == 0, result.stderr
    assert "First 2 of 5 steps shown, by job id (raise --limit)." in result.stdout
    data = json.loads(eddyq("workflow", str(workflow.id), "--limit", "2", "--json").stdout)
    assert len(data["steps"]) == 2 and data["more"] is True
    assert all(step["state"] == "pending" for step in data["steps"][1:])
    # A step's dependencies are named, whether they are listed or not.
    data = json.loads(eddyq("workflow", str(workflow.id), "--limit", "5", "--json").stdout)
    last = next(step for step in data["steps"] if step["name"] == "last")
    assert {dep["step"] for dep in last["after"]} == {step.name for step in parts}


def test_workflow_retry_brings_the_cancelled_steps_back(eddyq: Any) -> None:
    workflow = failed_workflow()
    _fetch, load, report, _notify = workflow.steps
    # Without a terminal it asks nothing, and refuses.
    result = eddyq("workflow", "retry", str(workflow.id), stdin="y\n")
    assert result.returncode == 2
    assert f"Retry the failed steps of workflow {workflow.id} (nightly)? (2 failed" in (
        result.stderr
    )
    assert "stdin is not a terminal. Add --yes" in result.stderr
    assert Job.objects.get(pk=load.job_id).state == "failed"

    result = eddyq("workflow", "retry", str(workflow.id), "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"Retried 1 step of workflow {workflow.id} (nightly); the steps cancelled because of "
        "it are pending again."
    )
    assert Job.objects.get(pk=load.job_id).state == "available"
    assert Job.objects.get(pk=report.job_id).state == "pending"
    assert WorkflowRun.objects.get(pk=workflow.id).state == "running"

    # Nothing left to retry: exit 1.
    result = eddyq("workflow", "retry", str(workflow.id), "--yes")
    assert result.returncode == 1
    assert "has no failed or cancelled step: nothing to retry" in result.stderr


def test_workflow_cancel_cancels_the_unfinished_steps(eddyq: Any) -> None:
    workflow = failed_workflow()
    _fetch, load, report, _notify = workflow.steps
    Job.objects.get(pk=load.job_id).retry()
    result = eddyq("workflow", "cancel", str(workflow.id), "--yes", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "workflow": workflow.id,
        "operation": "cancel",
        "changed": 2,
        "state": "cancelled",
    }
    assert {Job.objects.get(pk=step.job_id).state for step in (load, report)} == {"cancelled"}
    assert WorkflowRun.objects.get(pk=workflow.id).state == "cancelled"

    result = eddyq("workflow", "cancel", str(workflow.id), "--yes")
    assert result.returncode == 1
    assert f"Workflow {workflow.id} (nightly) has ended (cancelled): nothing to cancel." in (
        result.stderr
    )


def test_a_workflow_that_is_not_there_exits_1(eddyq: Any) -> None:
    for arguments in (("987654321",), ("retry", "987654321", "--yes"), ("cancel", "987654321")):
        result = eddyq("workflow", *arguments)
        assert result.returncode == 1
        assert "No workflow 987654321" in result.stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("x",), "'x' is neither a workflow id nor an ACTION (retry or cancel)"),
        (("retry",), "workflow retry takes the ID of one workflow"),
        (("cancel", "1", "2"), "workflow cancel takes the ID of one workflow"),
        (("1", "2"), "workflow takes one ID, or an ACTION (retry or cancel) and an ID"),
        (("retry", "0"), "'0' is not a workflow id"),
        (("--", "-3"), "'-3' is neither a workflow id"),
        (("1", "--limit", "0"), "give 1 to 10,000 steps"),
    ],
)
def test_workflow_bad_usage_exits_2(eddyq: Any, arguments: tuple[str, ...], message: str) -> None:
    result = eddyq("workflow", *arguments)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize(("answer", "state"), [("n", "failed"), ("y", "available")])
def test_workflow_retry_asks_on_a_terminal(
    worker_environment: dict[str, str], answer: str, state: str
) -> None:
    workflow = failed_workflow()
    load = workflow.steps[1]
    controller, terminal = pty.openpty()
    try:
        os.write(controller, f"{answer}\n".encode())
        result = subprocess.run(
            [sys.executable, str(MANAGE), "eddyq", "workflow", "retry", str(workflow.id)],
            env=worker_environment,
            stdin=terminal,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.close(terminal)
        os.close(controller)
    assert result.returncode == 0, result.stderr
    assert f"Retry the failed steps of workflow {workflow.id} (nightly)?" in result.stderr
    assert "[y/N]" in result.stderr
    assert ("Nothing changed." in result.stderr) == (answer == "n")
    assert Job.objects.get(pk=load.job_id).state == state
