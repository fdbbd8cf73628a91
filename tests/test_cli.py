"""``manage.py eddyq``: run as an operator runs it, a subprocess against real PostgreSQL; its
tables, its JSON, its exit statuses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from django_eddyq.election import ELECTION
from django_eddyq.models import Job, Leader, Queue, WorkerProcess
from tests.factories import JobFactory, QueueFactory
from tests.processes import MANAGE

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
        "QUEUE", "PAUSED", "AVAILABLE", "SCHEDULED", "RUNNING", "RETRYABLE", "COMPLETED",
        "FAILED", "CANCELLED", "OLDEST", "DUE", "COMPLETED", "1/5/15M", "FAILED", "1/5/15M",
    ]  # fmt: skip
    default = next(line for line in lines if line.startswith("default"))
    assert default.split()[:9] == ["default", "no", "3", "0", "0", "0", "0", "1", "0"]
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
    process = subprocess.Popen(
        [sys.executable, str(MANAGE), "eddyq", "status", "--json", "--watch", "0.2"],
        env=worker_environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
    for subcommand in ("status", "job", "pause", "resume"):
        result = eddyq(subcommand, "--help")
        assert result.returncode == 0
        assert "--json" in result.stdout
