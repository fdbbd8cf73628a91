"""``manage.py eddyq_health``, run as Kubernetes' exec probes run it: a process of its own, against
the real database, beside real worker processes (STALE_AFTER is 5s in their environment).

Also the statement it shares with the latency gauge, ``inspection.queue_latencies``: what it
answers, and that it answers from the queue index without reading every available job.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from django_eddyq import enqueue, inspection, sql
from django_eddyq.election import ELECTION
from django_eddyq.models import Job, Leader, WorkerProcess
from tests import jobs
from tests.factories import JobFactory, QueueFactory
from tests.processes import MANAGE, StartWorker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HOST = socket.gethostname()
STALE_AFTER = timedelta(seconds=5)  # as in the worker_environment fixture


def health(
    environment: dict[str, str], *arguments: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), "eddyq_health", *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def healthy(result: subprocess.CompletedProcess[str]) -> str:
    """The one line of a healthy answer."""
    assert (result.returncode, result.stderr) == (0, ""), result
    assert result.stdout.startswith("ok: ") and result.stdout.count("\n") == 1, result
    return result.stdout.strip()


def unhealthy(result: subprocess.CompletedProcess[str]) -> str:
    """The one line of an unhealthy answer."""
    assert (result.returncode, result.stdout) == (1, ""), result
    assert result.stderr.startswith("unhealthy: ") and result.stderr.count("\n") == 1, result
    return result.stderr.strip()


def registered(process: subprocess.Popen[bytes]) -> WorkerProcess:
    """The registry's row of the worker process (its only worker), once it has one."""
    wait_for(lambda: WorkerProcess.objects.filter(pid=process.pid, host=HOST).exists())
    return WorkerProcess.objects.get(pid=process.pid, host=HOST)


def status_of(worker: WorkerProcess) -> str:
    workers = inspection.with_worker_status(WorkerProcess.objects.filter(pk=worker.pk), STALE_AFTER)
    return str(workers.values_list("status", flat=True).get())


def leading(worker: WorkerProcess) -> bool:
    return Leader.objects.filter(
        name=ELECTION, leader_id=worker.id, expires_at__gt=timezone.now()
    ).exists()


# The database.


def test_the_database_answers(worker_environment: dict[str, str]) -> None:
    line = healthy(health(worker_environment))
    assert line.startswith("ok: database default answers (")


def test_an_unreachable_database_is_unhealthy_at_once(worker_environment: dict[str, str]) -> None:
    closed = {**worker_environment, "DATABASE_URL": "postgres://eddyq@127.0.0.1:1/eddyq"}
    started = time.monotonic()
    line = unhealthy(health(closed, "--worker"))
    assert time.monotonic() - started < 10
    assert line.startswith("unhealthy: database default does not answer: ")
    assert "Connection refused" in line


def test_database_down_ok_passes_when_the_database_does_not_answer(
    worker_environment: dict[str, str],
) -> None:
    closed = {**worker_environment, "DATABASE_URL": "postgres://eddyq@127.0.0.1:1/eddyq"}
    line = healthy(health(closed, "--worker", "--database-down-ok"))
    assert "does not answer" in line
    assert "nothing else was checked (--database-down-ok)" in line


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never says a word: a database cut off mid-way."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


def test_a_silent_database_is_unhealthy_within_the_timeout(
    worker_environment: dict[str, str], silent_server: int
) -> None:
    silent = {
        **worker_environment,
        "DATABASE_URL": f"postgres://eddyq@127.0.0.1:{silent_server}/eddyq",
    }
    started = time.monotonic()
    line = unhealthy(health(silent, "--timeout", "1s"))
    assert time.monotonic() - started < 10
    assert line == "unhealthy: no answer within 1s (--timeout) connecting to database default"
    line = healthy(health(silent, "--timeout", "1s", "--worker", "--database-down-ok"))
    assert line.startswith("ok: no answer within 1s (--timeout) connecting to database default")


@pytest.mark.parametrize(
    "arguments",
    [
        ("--max-latency", "soon"),
        ("--max-latency", "-5m"),
        ("--max-latency",),
        ("--timeout", "0s"),
        ("--no-such-option",),
    ],
)
def test_bad_usage_exits_2(worker_environment: dict[str, str], arguments: tuple[str, ...]) -> None:
    result = health(worker_environment, *arguments)
    assert result.returncode == 2, result
    assert "error:" in result.stderr


# The worker of this host.


def test_no_worker_has_registered(worker_environment: dict[str, str]) -> None:
    line = unhealthy(health(worker_environment, "--worker"))
    assert line == f"unhealthy: no worker on host {HOST}: none has registered from it"


def test_a_live_worker_then_a_stopped_one(
    worker_environment: dict[str, str], start_worker: StartWorker
) -> None:
    process = start_worker()
    worker = registered(process)
    wait_for(lambda: leading(worker))

    line = healthy(health(worker_environment, "--worker", "--leader"))
    assert f"worker {worker.id} on {HOST} seen " in line
    assert f"leader {worker.id}" in line

    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert status_of(worker) == "stopped"
    line = unhealthy(health(worker_environment, "--worker"))
    assert line.startswith(f"unhealthy: no live worker on host {HOST}: worker {worker.id} stopped ")
    # It resigned as it stopped.
    assert "no leader: the lease of the last, " in unhealthy(health(worker_environment, "--leader"))


def test_a_killed_worker_is_lost_once_stale(
    worker_environment: dict[str, str], start_worker: StartWorker
) -> None:
    process = start_worker("--no-maintenance")
    worker = registered(process)
    healthy(health(worker_environment, "--worker"))

    process.send_signal(signal.SIGKILL)
    process.wait(10)
    killed_at = time.monotonic()
    wait_for(lambda: status_of(worker) == "lost", seconds=STALE_AFTER.total_seconds() + 10)
    assert time.monotonic() - killed_at > STALE_AFTER.total_seconds() - 2  # its last heartbeat
    line = unhealthy(health(worker_environment, "--worker"))
    assert line.startswith(
        f"unhealthy: no live worker on host {HOST}: worker {worker.id} last seen "
    )
    assert line.endswith(" ago (STALE_AFTER 5s)")


def test_a_live_worker_elsewhere_passes_beside_lost_ones(
    worker_environment: dict[str, str],
) -> None:
    """A pod's earlier workers (killed by the restart) stay in the registry, lost: a live one
    is enough. --host checks another host."""
    now = timezone.now()
    for number, seen in enumerate((timedelta(minutes=5), timedelta(seconds=1))):
        WorkerProcess.objects.create(
            id=f"web-1:{number}:ab",
            host="web-1",
            pid=number,
            version="0",
            concurrency=1,
            last_seen_at=now - seen,
        )
    line = healthy(health(worker_environment, "--host", "web-1"))
    assert "worker web-1:1:ab on web-1 seen " in line
    lost = WorkerProcess.objects.filter(pk="web-1:1:ab")
    lost.update(last_seen_at=Now() - timedelta(seconds=73))
    line = unhealthy(health(worker_environment, "--worker", "--host", "web-1"))
    assert re.fullmatch(
        r"unhealthy: no live worker on host web-1: worker web-1:1:ab last seen 1m1[3-9]s ago "
        r"\(STALE_AFTER 5s\)",
        line,
    ), line


# The leader.


def test_leader(worker_environment: dict[str, str]) -> None:
    assert unhealthy(health(worker_environment, "--leader")) == (
        "unhealthy: no leader: none has ever been elected"
    )
    now = timezone.now()
    Leader.objects.create(
        name=ELECTION, leader_id="web-1:1:ab", expires_at=now + timedelta(seconds=30)
    )
    assert healthy(health(worker_environment, "--leader")).endswith("; leader web-1:1:ab")
    Leader.objects.filter(name=ELECTION).update(expires_at=now - timedelta(seconds=1))
    line = unhealthy(health(worker_environment, "--leader"))
    assert line.startswith("unhealthy: no leader: the lease of the last, web-1:1:ab, ended at ")


# The queues' latency.


def test_max_latency(worker_environment: dict[str, str]) -> None:
    now = timezone.now()
    JobFactory(queue="emails", run_at=now - timedelta(seconds=2))
    line = healthy(health(worker_environment, "--max-latency", "5m"))
    assert "no queue's oldest due job waited longer than 5m (longest: emails, " in line

    JobFactory(queue="emails", run_at=now - timedelta(minutes=10), priority=-5)
    JobFactory(queue="reports", run_at=now - timedelta(minutes=7))
    JobFactory(queue="fresh", run_at=now)
    line = unhealthy(health(worker_environment, "--max-latency", "5m"))
    assert line.startswith(
        "unhealthy: the oldest due job waited longer than --max-latency 5m in queues emails 10m"
    )
    assert ", reports 7m" in line
    assert "fresh" not in line
    assert healthy(health(worker_environment, "--max-latency", "1h"))

    # A paused queue's jobs wait on purpose.
    QueueFactory(name="emails", paused_at=now)
    line = unhealthy(health(worker_environment, "--max-latency", "5m"))
    assert "in queue reports 7m" in line and "emails" not in line
    Job.objects.filter(queue="reports").delete()
    line = healthy(health(worker_environment, "--max-latency", "5m"))
    assert "(longest: emails, 10m" in line and line.endswith(", paused)")


def test_every_check_that_fails_is_named(worker_environment: dict[str, str]) -> None:
    JobFactory(queue="emails", run_at=timezone.now() - timedelta(minutes=10))
    line = unhealthy(health(worker_environment, "--worker", "--leader", "--max-latency", "1m"))
    assert line.startswith(
        f"unhealthy: no worker on host {HOST}: none has registered from it; no leader: none has "
        "ever been elected; the oldest due job waited longer than --max-latency 1m in queue "
        "emails 10m"
    )


# The latency statement.


def test_queue_latencies_are_each_queues_oldest_due_available_job() -> None:
    now = timezone.now()
    assert inspection.queue_latencies() == {}
    for queue, priority, age in [
        ("emails", 0, 30),
        ("emails", 10, 90),  # the oldest of emails, not the first it would claim
        ("emails", -10, 60),
        ("reports", 5, 10),
    ]:
        JobFactory(queue=queue, priority=priority, run_at=now - timedelta(seconds=age))
    # Not due, not available: no wait.
    JobFactory(queue="emails", run_at=now + timedelta(hours=1))
    JobFactory(queue="later", run_at=now + timedelta(hours=1))
    JobFactory(queue="emails", state="scheduled", run_at=now - timedelta(hours=1))
    JobFactory(queue="emails", failed=True, run_at=now - timedelta(hours=2))
    latencies = inspection.queue_latencies()
    assert latencies.keys() == {"emails", "reports"}
    assert 90 <= latencies["emails"] < 120
    assert 10 <= latencies["reports"] < 40


def test_a_job_due_at_minus_infinity_waited_forever() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO eddyq_jobs (task, args, kwargs, queue, priority, state, attempt,"
            " max_attempts, run_at, created_at, errors, metadata)"
            " VALUES ('tests.jobs.add', '[]', '{}', 'odd', 0, 'available', 0, 25, '-infinity',"
            " now(), '[]', '{}')"
        )
    assert inspection.queue_latencies() == {"odd": float("inf")}


def test_the_latency_reads_the_queue_index_not_every_job() -> None:
    """A skip scan of eddyq_jobs_queue_claim_idx: a few index probes per queue and priority,
    whatever the number of available jobs."""
    specs = [
        enqueue.JobSpec.for_task(jobs.add.using(queue=queue, priority=priority), (1, 2), {})
        for queue in ("default", "emails", "reports")
        for priority in (-10, 0, 10)
        for _ in range(300)
    ]
    enqueue.insert_jobs(specs)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE eddyq_jobs")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, FORMAT JSON) " + sql.QUEUE_LATENCY)
        plan: dict[str, Any] = cursor.fetchone()[0][0]

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    scans = [node for node in nodes(plan["Plan"]) if "Relation Name" in node]
    assert scans and {node.get("Index Name") for node in scans} == {"eddyq_jobs_queue_claim_idx"}
    # Each probe reads a row at most: never the 2,700 jobs.
    assert sum(node["Actual Rows"] * node["Actual Loops"] for node in scans) <= 2 * 9 + 1
