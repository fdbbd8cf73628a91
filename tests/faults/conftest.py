"""The fault suite's tools: a fleet of real worker processes, their logs, and the database.

Every process a test starts goes through the ``fleet`` fixture, which kills whatever is left of
them at the end, failed test or not (a stopped process is continued first, so that nothing lingers
frozen), and prints their logs when the test failed. Timings are short (job and leader leases of
two seconds) and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from django_eddyq import Task
from django_eddyq.models import Job
from tests import jobs
from tests.processes import MANAGE, children_of

# The worker processes' timings: job leases and the leader lease of 2s.
FAULT_TIMINGS = {
    "EDDYQ_POLL_INTERVAL": "100ms",
    "EDDYQ_HEARTBEAT_INTERVAL": "500ms",
    "EDDYQ_STALE_AFTER": "2s",
    "EDDYQ_LEADER_LEASE": "2s",
    "EDDYQ_LEADER_RENEW_INTERVAL": "500ms",
    "EDDYQ_RESCUE_INTERVAL": "300ms",
    "EDDYQ_SCHEDULER_INTERVAL": "200ms",
    # Each maintenance pass logs its leader and time window at DEBUG.
    "DJANGO_LOG_LEVEL": "DEBUG",
}
LEASE = 2.0
RENEW_INTERVAL = 0.5
RESCUED = "django_eddyq.exceptions.JobRescued"

WORKER_STARTED = re.compile(r"eddyq worker (\S+) started")
PASS_WINDOW = re.compile(r"eddyq (\S+): pass by leader (\S+) from ([0-9.]+) to ([0-9.]+)")
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (\w+)\s+(.*)$")


def wait_until(condition: Callable[[], object], seconds: float, what: str) -> None:
    """Poll ``condition`` until it is true; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g}s waiting for {what}")
        time.sleep(0.05)


@dataclass(frozen=True)
class PassWindow:
    """One maintenance pass, as its process logged it (epoch seconds)."""

    service: str
    leader: str
    start: float
    end: float


@dataclass(eq=False)
class WorkerProcess:
    """One ``manage.py eddyq_worker`` process: a worker, or a supervisor of several."""

    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self) -> list[tuple[str, str]]:
        """(level, message) of each log line; tracebacks and continuation lines left out."""
        return [
            (match.group(1), match.group(2))
            for match in map(LOG_LINE.match, self.text().splitlines())
            if match
        ]

    def logged(self, level: str, text: str) -> list[str]:
        return [message for lvl, message in self.lines() if lvl == level and text in message]

    def errors(self) -> list[str]:
        return [message for level, message in self.lines() if level in ("ERROR", "CRITICAL")]

    def worker_ids(self) -> list[str]:
        """The ids of the workers this process ran (a supervisor's: its children's)."""
        return WORKER_STARTED.findall(self.text())

    def worker_id(self, seconds: float = 30.0) -> str:
        """The id of this process's worker, once it has started."""
        wait_until(self.worker_ids, seconds, f"worker process {self.pid} to start")
        return self.worker_ids()[0]

    def signal(self, which: signal.Signals) -> None:
        os.kill(self.pid, which)

    def wait(self, seconds: float) -> int:
        return self.process.wait(seconds)


class Fleet:
    """Starts worker processes for one test and kills what is left of them at the end."""

    def __init__(self, environment: dict[str, str], logs: Path) -> None:
        self.environment = environment
        self.logs = logs
        self.started: list[WorkerProcess] = []

    def start(self, *arguments: str) -> WorkerProcess:
        log = self.logs / f"worker-{len(self.started)}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [sys.executable, str(MANAGE), "eddyq_worker", *arguments],
                env=self.environment,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        worker = WorkerProcess(process, log)
        self.started.append(worker)
        return worker

    def pass_windows(self) -> list[PassWindow]:
        """Every maintenance pass any process of the fleet logged, in order of start."""
        windows = [
            PassWindow(service, leader, float(start), float(end))
            for worker in self.started
            for service, leader, start, end in PASS_WINDOW.findall(worker.text())
        ]
        return sorted(windows, key=lambda window: window.start)

    def kill_all(self) -> None:
        for worker in self.started:
            if not worker.alive():
                continue
            for pid in [*children_of(worker.pid), worker.pid]:
                for which in (signal.SIGCONT, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, which)
            worker.process.wait(10)

    def logs_text(self) -> str:
        return "\n".join(
            f"----- {worker.log.name} (pid {worker.pid}) -----\n{worker.text()[-8000:]}"
            for worker in self.started
        )


@pytest.fixture
def fault_environment(worker_environment: dict[str, str]) -> dict[str, str]:
    """The environment of the fleet's processes: this test's database, the fault timings."""
    worker_environment.update(FAULT_TIMINGS)
    # Handlers keep their Django connection from job to job, as in production.
    worker_environment["DATABASE_URL"] += "?conn_max_age=60"
    return worker_environment


@pytest.fixture
def fleet(
    fault_environment: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Fleet]:
    started = Fleet(fault_environment, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(started.logs_text())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Keep each phase's report on the item, so that ``fleet`` knows whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# The database, as the test process sees it.


def count_by_state(ids: list[int] | None = None) -> dict[str, int]:
    """How many of the jobs ``ids`` (default: all) are in each state."""
    rows = Job.all_objects.all()
    if ids is not None:
        rows = rows.filter(pk__in=ids)
    counts: dict[str, int] = {}
    for state in rows.values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
    return counts


def enqueue_recorded(
    durations: list[float], task: Task[..., Any] = jobs.record_execution, **options: Any
) -> list[int]:
    """Enqueue one job of ``task`` (``record_execution`` or a task of the same arguments) per
    duration; each is given its own id."""
    task = task.using(**options)
    with transaction.atomic():
        ids = [job.pk for job in task.enqueue_many([(0, seconds) for seconds in durations])]
        with connection.cursor() as cursor:
            # Not yet committed, so no worker has seen them: each job's first argument becomes
            # its own id, which its handler writes into its Execution row.
            cursor.execute(
                "UPDATE eddyq_jobs SET args = jsonb_set(args, '{0}', to_jsonb(id))"
                " WHERE id = ANY(%s)",
                [ids],
            )
    return ids


def current_leader() -> str | None:
    """The worker id holding the leader lease now, by the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT leader_id FROM eddyq_leader WHERE name = 'default' AND expires_at > now()"
        )
        row = cursor.fetchone()
    return row[0] if row else None


def other_backends() -> list[int]:
    """The pids of every other client session on this test's database: the workers'."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return [pid for (pid,) in cursor.fetchall()]


def terminate_backends(pids: list[int]) -> int:
    """``pg_terminate_backend`` each of ``pids``; returns how many it signalled."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
            " FROM unnest(%s::int[]) AS pid",
            [pids],
        )
        return int(cursor.fetchone()[0])
