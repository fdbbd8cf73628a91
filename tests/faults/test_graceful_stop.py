"""Graceful stop under load: SIGTERM while 50 jobs run.

Jobs that finish within ``--shutdown-timeout`` end completed; the others go back to available
with their attempt given back and their lease cleared; the process exits 0, within the timeout.
"""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

from demo.models import Execution
from django_eddyq.models import Job
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
    short = enqueue_recorded([0.3 + 0.05 * n for n in range(25)])
    long = enqueue_recorded([60.0] * 25)
    worker = fleet.start(*layout, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT))
    wait_until(lambda: count_by_state().get("running", 0) == 50, 30, "all 50 jobs to run")
    # Claimed is not yet started: a handler thread takes each job up a moment later, and a job
    # not yet started when the worker is told to stop is handed back at once, not run.
    time.sleep(0.25)

    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(SHUTDOWN_TIMEOUT + 10) == 0
    took = time.monotonic() - signalled
    assert took < SHUTDOWN_TIMEOUT + EXIT_SLACK, f"took {took:.2f}s to stop"

    assert count_by_state(short) == {"completed": 25}
    assert count_by_state(long) == {"available": 25}
    for attempt, errors, locked_by, locked_until, result in Job.all_objects.filter(
        pk__in=long
    ).values_list("attempt", "errors", "locked_by", "locked_until", "result"):
        assert (attempt, errors, locked_by, locked_until, result) == (0, [], None, None, None)
    for job_id, attempt, errors, result in Job.all_objects.filter(pk__in=short).values_list(
        "id", "attempt", "errors", "result"
    ):
        assert (attempt, errors, result) == (1, [], job_id)
    executions = Counter(Execution.objects.values_list("job_id", flat=True))
    assert executions == Counter(short)  # each finished job ran once; the others never got far
    assert "handed back" in worker.text()
