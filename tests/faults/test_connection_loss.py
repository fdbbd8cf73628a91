"""Database connection loss: every worker connection terminated mid-run, and a server restart.

Workers must reconnect (with back-off while the server is away), log one WARNING when the
connection goes and one INFO when it is back, and carry on; jobs in flight end completed, none
lost and none left running. Restarting the server needs one this test may restart: the embedded
server of CI's run without DATABASE_URL. With an external DATABASE_URL that test is skipped and
only the terminations run.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest
from django.db import connections

from demo.models import Execution
from django_eddyq.models import Job
from testproject.databases import EXTERNAL_DATABASE
from tests.faults.conftest import (
    Fleet,
    WorkerProcess,
    count_by_state,
    enqueue_recorded,
    other_backends,
    terminate_backends,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

JOBS = 400
LOST = "lost its database connection"
BACK = "reconnected to the database"


def start_busy_workers(fleet: Fleet) -> tuple[list[int], list[WorkerProcess]]:
    ids = enqueue_recorded([0.02 + (n % 5) * 0.01 for n in range(JOBS)])
    workers = [fleet.start("--concurrency", "4") for _ in range(2)]
    for worker in workers:
        worker.worker_id()
    wait_until(lambda: count_by_state(ids).get("completed", 0) >= 50, 30, "work to get going")
    return ids, workers


def check_nothing_lost(ids: list[int], workers: list[WorkerProcess]) -> None:
    wait_until(
        lambda: count_by_state(ids).get("completed", 0) == JOBS, 60, f"all {JOBS} jobs to end"
    )
    assert all(worker.alive() for worker in workers), "a worker died"
    assert not Job.all_objects.filter(state="running").exists()
    executions = Counter(
        Execution.objects.filter(label="execution").values_list("job_id", flat=True)
    )
    assert set(executions) == set(ids)
    for job_id, errors, attempt in Job.all_objects.filter(pk__in=ids).values_list(
        "id", "errors", "attempt"
    ):
        # Run again only after an attempt that failed (its connection cut) or was rescued
        # (its lease ran out while the server was away), as its errors say.
        assert attempt == 1 + len(errors), (job_id, attempt, errors)
        assert executions[job_id] <= attempt, (job_id, executions[job_id], errors)


def check_one_warning_and_one_info(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        assert len(worker.logged("WARNING", LOST)) == 1, worker.text()
        assert len(worker.logged("INFO", BACK)) == 1, worker.text()
        assert worker.errors() == [], f"worker {worker.pid} logged errors:\n" + "\n".join(
            worker.errors()
        )


def test_workers_carry_on_when_every_connection_is_terminated(fleet: Fleet) -> None:
    ids, workers = start_busy_workers(fleet)
    backends = other_backends()
    # Each worker: its own books, the listener, the elector, handlers (and the leader's
    # maintenance).
    assert len(backends) >= 2 * 4
    assert terminate_backends(backends) > 0

    wait_until(lambda: all(w.logged("INFO", BACK) for w in workers), 10, "the reconnections")
    check_nothing_lost(ids, workers)
    check_one_warning_and_one_info(workers)


@pytest.mark.skipif(
    EXTERNAL_DATABASE or not os.environ.get("EDDYQ_EMBEDDED_PGDATA"),
    reason="restarts the embedded PostgreSQL: runs in CI's phase without DATABASE_URL",
)
def test_workers_carry_on_across_a_restart_of_the_server(fleet: Fleet) -> None:
    from django_eddyq import embedded

    ids, workers = start_busy_workers(fleet)
    data = os.environ["EDDYQ_EMBEDDED_PGDATA"]
    try:
        embedded.stop(data, mode="fast")
        time.sleep(1.5)  # the workers find the server gone, and try again with back-off
    finally:
        embedded.start(data)  # whatever happens, the rest of the run needs its server
    for connection in connections.all():
        connection.close()  # this test's own connection went with the server

    wait_until(lambda: all(w.logged("INFO", BACK) for w in workers), 20, "the reconnections")
    check_nothing_lost(ids, workers)
    check_one_warning_and_one_info(workers)
