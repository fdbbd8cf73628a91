"""Poison: no value in a row, and nothing a handler returns or raises, stops a worker or the
leader's services.

The process tests feed a real worker process, which also leads (rescuer, scheduler, cleaners),
rows written by another producer and handlers that misbehave, beside ordinary jobs. Then each
checks that the worker and the leader still work (an ordinary job enqueued afterwards completes,
a stuck job is rescued, a job scheduled a moment ahead runs), that each poisoned job ended with
an error entry saying why, and that no ordinary job lost its result or an attempt.

The in-process tests make the database refuse one job's outcome or rescue with a trigger, as a
value PostgreSQL cannot store would: only that job fails, saying so, and the others are written.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from django_eddyq.maintenance import Rescuer
from django_eddyq.models import Job
from django_eddyq.worker import Worker
from tests import jobs
from tests.faults.conftest import Fleet, wait_until

HUGE = "9" * 5000  # digits: more than Python reads as an int by default
DEEP = "[" * 12000 + "]" * 12000  # more nesting than Python's JSON reader recurses (3.13: 10,000)

INSERT_BY_HAND = """
INSERT INTO eddyq_jobs (
    task, args, kwargs, queue, priority, state, attempt, max_attempts, run_at, created_at,
    errors, retention, metadata, locked_by, locked_until, batch_id
)
VALUES (
    %(task)s, %(args)s::jsonb, %(kwargs)s::jsonb, 'default', 0, %(state)s, %(attempt)s,
    %(max_attempts)s, %(run_at)s::timestamptz, now(), %(errors)s::jsonb, %(retention)s::jsonb,
    %(metadata)s::jsonb, %(locked_by)s, %(locked_until)s::timestamptz, %(batch_id)s
)
RETURNING id
"""
ROW_DEFAULTS: dict[str, Any] = {
    "task": "tests.jobs.echo",
    "args": "[]",
    "kwargs": "{}",
    "state": "available",
    "attempt": 0,
    "max_attempts": 1,
    "run_at": "now",
    "errors": "[]",
    "retention": None,
    "metadata": "{}",
    "locked_by": None,
    "locked_until": None,
    "batch_id": None,
}


def write_row(**columns: Any) -> int:
    """A row as another producer (or an edit by hand) might write it, past every check of
    ``enqueue()``: only the table's own constraints apply."""
    with connection.cursor() as cursor:
        cursor.execute(INSERT_BY_HAND, {**ROW_DEFAULTS, **columns})
        return int(cursor.fetchone()[0])


# Rows and what becomes of each: (its columns, the state it ends in, what its last error says;
# None: no error).
POISONED_ROWS: dict[str, tuple[dict[str, Any], str, str | None]] = {
    "args holding a huge integer": ({"args": f"[{HUGE}]"}, "failed", "args of job"),
    "kwargs holding a huge integer": ({"kwargs": f'{{"n": {HUGE}}}'}, "failed", "kwargs of job"),
    "metadata holding a huge integer": ({"metadata": f'{{"n": {HUGE}}}'}, "failed", "metadata"),
    "args nested too deep to read": ({"args": DEEP}, "failed", "cannot be read"),
    "args an object": ({"args": '{"a": 1}'}, "failed", "an object, not an array"),
    "args a JSON null": ({"args": "null"}, "failed", "null, not an array"),
    "kwargs an array": ({"kwargs": "[1, 2]"}, "failed", "an array, not an object"),
    "kwargs a number": ({"kwargs": "5"}, "failed", "a number, not an object"),
    "metadata an array": ({"metadata": "[]"}, "failed", "metadata of job"),
    "metadata a string": ({"metadata": '"x"'}, "failed", "metadata of job"),
    "a task no one declared": ({"task": "os.system", "args": '["true"]'}, "failed", "registered"),
    "due at -infinity": ({"run_at": "-infinity"}, "completed", None),
    "the largest attempt": ({"attempt": 2**31 - 1, "max_attempts": 2**31 - 1}, "completed", None),
    "retention an array": ({"retention": '["completed"]'}, "completed", None),
    "retention a string": ({"retention": '"completed"'}, "completed", None),
    "errors an object, then a failure": (
        {"task": "tests.jobs.always_fails", "args": '["boom"]', "errors": "{}"},
        "failed",
        "ValueError: boom",
    ),
    "a lease that ended at -infinity": (
        {"state": "running", "attempt": 1, "locked_by": "gone:1:x", "locked_until": "-infinity"},
        "failed",
        "JobRescued",
    ),
    "due at infinity": ({"state": "scheduled", "run_at": "infinity"}, "scheduled", None),
}


def enqueue_bystanders(count: int = 30) -> dict[int, int]:
    """Ordinary jobs, run in the same passes as the poison: their ids and results to be."""
    return {jobs.add.enqueue(n, 1000).pk: n + 1000 for n in range(count)}


def check_bystanders(expected: dict[int, int]) -> None:
    """Each ordinary job completed on its first attempt, its result stored, no error."""
    found = {
        job_id: (state, attempt, result, errors)
        for job_id, state, attempt, result, errors in Job.all_objects.filter(
            pk__in=expected
        ).values_list("id", "state", "attempt", "result", "errors")
    }
    assert found == {job_id: ("completed", 1, result, []) for job_id, result in expected.items()}


def settled(ids: list[int]) -> bool:
    return not Job.all_objects.filter(pk__in=ids, state__in=["available", "running"]).exists()


def check_still_working(worker: Any) -> None:
    """The worker runs what comes next, and the leader's rescuer and scheduler still work."""
    after = jobs.add.enqueue(2, 3)
    stuck = write_row(
        state="running",
        attempt=1,
        max_attempts=3,
        locked_by="gone:2:y",
        locked_until=(datetime.now(UTC) - timedelta(seconds=1)).isoformat(),
    )
    soon = jobs.add.using(run_at=timedelta(seconds=1)).enqueue(4, 5)
    wait_until(
        lambda: (
            Job.all_objects.filter(pk__in=[after.pk, soon.pk], state="completed").count() == 2
            and Job.all_objects.get(pk=stuck).state != "running"
        ),
        20,
        "the worker and the leader to carry on after the poison",
    )
    rescued = Job.all_objects.get(pk=stuck)
    assert rescued.errors[-1]["rescued_from"] == "gone:2:y"
    assert worker.alive()
    assert not worker.logged("ERROR", "its loop failed")


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
def test_rows_another_producer_wrote_fail_alone(fleet: Fleet) -> None:
    bystanders = enqueue_bystanders()
    rows = {name: write_row(**columns) for name, (columns, _, _) in POISONED_ROWS.items()}
    bystanders |= enqueue_bystanders()
    worker = fleet.start("--concurrency", "10")
    worker.worker_id()
    wait_until(lambda: settled([*rows.values(), *bystanders]), 20, "every row to be tried")

    problems = []
    for name, job_id in rows.items():
        _, state, says = POISONED_ROWS[name]
        # Not the whole row: Python has no datetime for -infinity.
        found, errors = Job.all_objects.values_list("state", "errors").get(pk=job_id)
        last = errors[-1]["error"] if errors and isinstance(errors[-1], dict) else None
        if found != state or (says is None) != (last is None) or (says and says not in last):
            problems.append(f"{name}: {found}, last error {last!r}")
    assert problems == []
    check_bystanders(bystanders)
    check_still_working(worker)
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
def test_what_handlers_raise_and_delay_fails_alone(fleet: Fleet) -> None:
    bystanders = enqueue_bystanders()
    poisoned = {
        "a backoff of 1e15 seconds": jobs.fails_with_a_huge_backoff.enqueue(),
        "a backoff of NaN": jobs.fails_with_a_nan_backoff.enqueue(),
        "Snooze(inf)": jobs.snoozes_for.enqueue("inf"),
        "Snooze(nan)": jobs.snoozes_for.enqueue("nan"),
        "Snooze(1e300)": jobs.snoozes_for.enqueue("1e300"),
        "an exception that cannot be shown": jobs.raises_the_unstorable.enqueue(),
        "a message holding NUL": jobs.raises_with_nul.enqueue(),
    }
    bystanders |= enqueue_bystanders()
    worker = fleet.start("--concurrency", "10")
    worker.worker_id()
    ids = [job.pk for job in poisoned.values()]
    wait_until(lambda: settled([*ids, *bystanders]), 20, "every job to be tried")

    def stored(name: str) -> Job:
        return Job.all_objects.get(pk=poisoned[name].pk)

    century = datetime.now(UTC) + timedelta(days=36500)
    huge = stored("a backoff of 1e15 seconds")
    assert (huge.state, huge.attempt) == ("retryable", 1)
    assert huge.run_at > century - timedelta(days=2)  # cut to the longest delay
    assert huge.errors[-1]["error"] == "ValueError: first failure"
    nan = stored("a backoff of NaN")
    assert nan.state == "retryable"
    assert nan.run_at < datetime.now(UTC) + timedelta(minutes=1)  # the default backoff
    for name, says in [
        ("Snooze(inf)", "ValueError: Snooze takes a finite delay, not inf"),
        ("Snooze(nan)", "ValueError: Snooze takes a delay of zero or more seconds, not nan"),
    ]:
        job = stored(name)
        assert (job.state, job.errors[-1]["error"]) == ("retryable", says), name
    far = stored("Snooze(1e300)")
    assert (far.state, far.attempt, far.errors) == ("scheduled", 0, [])
    assert far.run_at > century - timedelta(days=2)
    unshown = stored("an exception that cannot be shown")
    assert unshown.state == "failed"
    assert unshown.errors[-1]["error"] == "_Unprintable: <str() of the _Unprintable raised>"
    assert "NUL \\x00 and a lone surrogate \ufffd" in unshown.errors[-1]["traceback"]
    nul = stored("a message holding NUL")
    assert nul.errors[-1]["error"] == (
        "ValueError: NUL \\x00 and a lone surrogate \ufffd in a message"
    )
    check_bystanders(bystanders)
    check_still_working(worker)


# The database refusing one job's write, as a value it cannot store would.


@contextmanager
def refused(job_id: int, states: list[str]) -> Iterator[None]:
    """While in the block, PostgreSQL refuses to move job ``job_id`` into any of ``states``."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            CREATE FUNCTION eddyq_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.id = {int(job_id)} AND NEW.state = ANY({_array(states)}) THEN
                    RAISE EXCEPTION 'job % refused by the test', NEW.id;
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER eddyq_test_refuse BEFORE UPDATE ON eddyq_jobs
                FOR EACH ROW EXECUTE FUNCTION eddyq_test_refuse();
            """
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER eddyq_test_refuse ON eddyq_jobs; DROP FUNCTION eddyq_test_refuse()"
            )


def _array(states: list[str]) -> str:
    return "ARRAY[" + ", ".join(f"'{state}'" for state in states) + "]"


@pytest.mark.django_db(transaction=True)
def test_an_outcome_the_database_refuses_fails_its_job_alone(
    run_burst_worker: Callable[..., Worker], caplog: pytest.LogCaptureFixture
) -> None:
    bystanders = enqueue_bystanders(20)
    doomed = jobs.add.enqueue(1, 1)
    bystanders |= enqueue_bystanders(20)
    with refused(doomed.pk, ["completed"]):
        worker = run_burst_worker(concurrency=10)
    job = Job.all_objects.get(pk=doomed.pk)
    assert (job.state, job.attempt, job.result) == ("failed", 1, None)
    [entry] = job.errors
    assert entry["error"].startswith(
        "OutcomeNotStored: the outcome of attempt 1 (completed) could not be stored: "
    )
    assert f"job {doomed.pk} refused by the test" in entry["error"]
    assert entry["worker"] == worker.id
    check_bystanders(bystanders)
    assert "writing its" in caplog.text  # the failed pass, said once as an ERROR


@pytest.mark.django_db(transaction=True)
def test_an_outcome_that_cannot_even_fail_is_left_to_the_rescuer(
    run_burst_worker: Callable[..., Worker],
) -> None:
    bystanders = enqueue_bystanders(10)
    doomed = jobs.add.enqueue(1, 1)
    with refused(doomed.pk, ["completed", "failed"]):
        run_burst_worker(concurrency=10)
    job = Job.all_objects.get(pk=doomed.pk)
    # Still running under its lease, which the worker no longer renews: the rescuer's to take.
    assert (job.state, job.attempt) == ("running", 1)
    check_bystanders(bystanders)


def stuck_job(**columns: Any) -> int:
    return write_row(
        state="running",
        attempt=1,
        max_attempts=3,
        locked_by="gone:1:x",
        locked_until=(datetime.now(UTC) - timedelta(seconds=5)).isoformat(),
        **columns,
    )


@pytest.mark.django_db(transaction=True)
def test_the_rescuer_sets_aside_a_job_it_cannot_rescue() -> None:
    before = [stuck_job() for _ in range(3)]
    doomed = stuck_job()
    after = [stuck_job() for _ in range(3)]
    with refused(doomed, ["retryable"]):
        assert Rescuer().run_once() == 7
    job = Job.all_objects.get(pk=doomed)
    assert job.state == "failed"
    assert job.errors[-1]["error"].startswith("JobRescued: worker gone:1:x stopped renewing")
    assert "could not be rescued, and was set aside" in job.errors[-1]["error"]
    assert set(Job.all_objects.filter(pk__in=before + after).values_list("state", flat=True)) == {
        "retryable"
    }


@pytest.mark.django_db(transaction=True)
def test_the_rescuer_rescues_the_rest_when_one_cannot_even_be_set_aside() -> None:
    doomed = stuck_job()
    others = [stuck_job() for _ in range(3)]
    with refused(doomed, ["retryable", "failed"]):
        assert Rescuer().run_once() == 3
    assert Job.all_objects.get(pk=doomed).state == "running"
    assert set(Job.all_objects.filter(pk__in=others).values_list("state", flat=True)) == {
        "retryable"
    }


@pytest.mark.django_db(transaction=True)
def test_a_job_the_start_up_rescue_cannot_take_does_not_stop_the_worker(
    run_burst_worker: Callable[..., Worker], caplog: pytest.LogCaptureFixture
) -> None:
    doomed = stuck_job()
    job = jobs.add.enqueue(2, 2)
    with refused(doomed, ["retryable", "failed"]):
        run_burst_worker()
    assert Job.all_objects.get(pk=job.pk).result == 4
    assert "cannot even be set aside" in caplog.text


def test_the_poison_is_poison() -> None:
    """The huge integer and the deep nesting are beyond what Python's JSON reader takes."""
    for text in (f"[{HUGE}]", DEEP):
        with pytest.raises((ValueError, RecursionError)):
            json.loads(text)
