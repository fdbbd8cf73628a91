"""Graceful stop under load: SIGTERM while 50 jobs run.

Jobs that finish within ``--shutdown-timeout`` end completed. A job whose handler had not
started goes back to available, its attempt given back and its lease cleared. A job whose
handler had started and still runs is never handed back while that handler may run: it stays
running under its lease, for the rescuer, and the process exits 0 at once, within the timeout.
Each handler records when it started, so that this can be told apart.
"""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

from demo.models import Execution
from django_eddyq.models import Job
from tests import jobs
from tests.faults.conftest import Fleet, count_by_state, enqueue_recorded, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

SHUTDOWN_TIMEOUT = 3.0
# Exiting takes a moment after the timeout: handing jobs back, closing connections.
EXIT_SLACK = 1.5


@pytest.mark.parametrize(
    "layout",
    [["--concurrency", "50"], ["--processes", "2", "--concurrency", "25"]],
    ids=["one-process", "supervisor"],
)
def test_sigterm_completes_what_finishes_in_time_and_hands_back_the_rest(
    fleet: Fleet, layout: list[str]
) -> None:
    # 25 jobs that end within the shutdown timeout, 25 that would run for a minute.
    recorded = jobs.record_start_then_execution
    short = enqueue_recorded([0.3 + 0.05 * n for n in range(25)], recorded)
    long = enqueue_recorded([60.0] * 25, recorded)
    worker = fleet.start(*layout, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT))
    wait_until(lambda: count_by_state().get("running", 0) == 50, 30, "all 50 jobs to run")
    # Claimed is not yet started: a handler thread takes each job up a moment later (on a
    # loaded machine, more than a moment), and records it.
    wait_until(
        lambda: Execution.objects.filter(label="started").count() == 50,
        30,
        "all 50 handlers to start",
    )

    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(SHUTDOWN_TIMEOUT + 10) == 0
    took = time.monotonic() - signalled
    assert took < SHUTDOWN_TIMEOUT + EXIT_SLACK, f"took {took:.2f}s to stop"

    assert count_by_state(short) == {"completed": 25}
    for job_id, attempt, errors, result in Job.all_objects.filter(pk__in=short).values_list(
        "id", "attempt", "errors", "result"
    ):
        assert (attempt, errors, result) == (1, [], job_id)
    started = set(
        Execution.objects.filter(label="started", job_id__in=long).values_list("job_id", flat=True)
    )
    assert started, "no long handler started: the test proves nothing"
    for job_id, state, attempt, errors, locked_by, locked_until in Job.all_objects.filter(
        pk__in=long
    ).values_list("id", "state", "attempt", "errors", "locked_by", "locked_until"):
        if job_id in started:
            # Its handler may still run: left under its lease for the rescuer, never handed back.
            assert (state, attempt, errors) == ("running", 1, []), job_id
            assert locked_by in worker.worker_ids() and locked_until is not None
        else:
            assert (state, attempt, errors, locked_by, locked_until) == (
                "available",
                0,
                [],
                None,
                None,
            ), job_id
    executions = Counter(
        Execution.objects.filter(label="execution").values_list("job_id", flat=True)
    )
    assert executions == Counter(short)  # each finished job ran once; the others never got far
    assert "left to the rescuer" in worker.text()
