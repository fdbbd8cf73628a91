"""Flow control: a queue's global concurrency and rate, as written (settings, API), as the claim
enforces them (the worker's own pass against real PostgreSQL), and across real worker
processes (the overlap of runs, computed from what the handlers recorded in the database)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_eddyq import set_queue_limits
from django_eddyq.conf import InvalidSettingError, eddyq_settings
from django_eddyq.limits import Limits, Rate, parse_rate
from django_eddyq.models import Job, Queue, RateBucket
from django_eddyq.operations import apply_configured_limits, set_queue_paused
from django_eddyq.worker.passes import Pass, PassRunner, connect, run_pass
from tests import jobs
from tests.factories import JobFactory
from tests.processes import StartWorker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


# What a limit is, as written.


@pytest.mark.parametrize(
    ("text", "limit", "period", "burst"),
    [
        ("100/m", 100, 60.0, 2),
        ("5/s", 5, 1.0, 5),
        ("1000/h", 1000, 3600.0, 1),
        ("2/10s", 2, 10.0, 1),
        (" 7 / 1.5s ", 7, 1.5, 5),
        ("3/day", 3, 86400.0, 1),
    ],
)
def test_a_rate_as_written(text: str, limit: int, period: float, burst: int) -> None:
    assert parse_rate(text) == Rate(limit, period, burst)


@pytest.mark.parametrize(
    ("text", "burst", "message"),
    [
        ("100", None, "rate '100' is invalid"),
        ("0/s", None, "give 1 or more jobs"),
        ("5/0s", None, "give 1 or more jobs"),
        ("5/fortnight", None, "is invalid"),
        (5, None, "rate 5 is invalid"),
        ("5/s", 6, "burst 6 is more than"),
        ("5/s", 0, "burst must be an integer"),
        ("5/s", True, "burst must be an integer"),
    ],
)
def test_a_bad_rate_says_what_is_wrong(text: Any, burst: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rate(text, burst)


def test_queue_limits_from_the_settings() -> None:
    with override_settings(EDDYQ={"QUEUES": {"emails": {"concurrency": 5, "rate": "100/m"}}}):
        assert {"emails": Limits(concurrency=5, rate=Rate(100, 60.0, 2))} == eddyq_settings.QUEUES


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        (["emails"], "is not a dict of queue names"),
        ({"bad name!": {}}, "is not a queue name"),
        ({"emails": 5}, "is not a dict of limits"),
        ({"emails": {"concurency": 5}}, "unknown keys concurency"),
        ({"emails": {"concurrency": 0}}, "concurrency must be an integer"),
        ({"emails": {"burst": 3}}, "burst is given without a rate"),
        ({"emails": {"rate": "fast"}}, "rate 'fast' is invalid"),
    ],
)
def test_bad_queue_limits_in_the_settings(queues: Any, message: str) -> None:
    with override_settings(EDDYQ={"QUEUES": queues}), pytest.raises(InvalidSettingError) as raised:
        _ = eddyq_settings.QUEUES
    assert message in str(raised.value)


def test_setting_and_lifting_limits_at_run_time() -> None:
    queue = set_queue_limits("emails", concurrency=3, rate="10/s")
    assert (queue.concurrency, queue.rate_limit, queue.rate_period, queue.rate_burst) == (
        3,
        10,
        1.0,
        10,
    )
    queue = set_queue_limits("emails")
    assert (queue.concurrency, queue.rate_limit, queue.rate_period, queue.rate_burst) == (
        None,
        None,
        None,
        None,
    )
    with pytest.raises(ValueError, match="concurrency must be"):
        set_queue_limits("emails", concurrency=-1)
    with pytest.raises(ValueError, match="queue name"):
        set_queue_limits("no such queue!", concurrency=1)


def test_a_row_cannot_hold_a_limit_the_claim_would_trip_on() -> None:
    Queue.objects.create(name="emails")
    odd = (
        ("concurrency", 0),
        ("rate_period", 0),
        ("rate_period", math.nan),  # PostgreSQL counts NaN and infinity above 0
        ("rate_period", math.inf),
        ("rate_burst", 1),
    )
    for column, value in odd:
        with pytest.raises(IntegrityError, match=r"eddyq_queues_(concurrency|rate)_valid"):
            Queue.objects.filter(name="emails").update(**{column: value})


def test_the_settings_apply_as_a_worker_starts_and_keep_an_unchanged_bucket() -> None:
    RateBucket.objects.create(name="emails", tokens=0.5, refilled_at="2026-01-01T00:00Z")
    Queue.objects.create(name="emails", rate_limit=10, rate_period=1.0, rate_burst=10)
    with override_settings(EDDYQ={"QUEUES": {"emails": {"concurrency": 2, "rate": "10/s"}}}):
        apply_configured_limits()
    assert Queue.objects.get(name="emails").concurrency == 2
    assert RateBucket.objects.get(name="emails").tokens == 0.5  # the same rate: kept
    set_queue_limits("emails", concurrency=2, rate="20/s")
    assert not RateBucket.objects.exists()  # a new rate starts from a full bucket


# The claim, as a worker's pass sends it.


@pytest.fixture
def worker_connection() -> Iterator[psycopg.Connection[Any]]:
    with connect() as conn:
        yield conn


def claim(
    conn: psycopg.Connection[Any],
    limit: int,
    *,
    limited: list[str],
    worker: str = "w-1",
    queues: list[str] | None = None,
) -> list[str]:
    """The queues of the jobs one pass claims."""
    done = run_pass(
        conn,
        Pass(outcomes=[], renew=[], promote=False, claim=limit, touch=[]),
        worker_id=worker,
        lease_seconds=60,
        queues=queues,
        limited=limited,
    )
    return sorted(job.queue for job in done.claimed)


def finish_one(queue: str) -> None:
    job = Job.objects.filter(queue=queue, state="running").first()
    assert job is not None
    Job.objects.filter(pk=job.pk).update(state="completed", locked_by=None)


def test_a_queue_at_its_concurrency_gives_no_more(worker_connection: Any) -> None:
    JobFactory.create_batch(10, queue="limited")
    JobFactory.create_batch(10, queue="default")
    set_queue_limits("limited", concurrency=3)
    # The other queues fill the rest of the claim.
    assert claim(worker_connection, 5, limited=["limited"]) == ["default"] * 2 + ["limited"] * 3
    assert claim(worker_connection, 5, limited=["limited"]) == ["default"] * 5
    assert claim(worker_connection, 5, limited=["limited"]) == ["default"] * 3
    finish_one("limited")
    assert claim(worker_connection, 5, limited=["limited"], worker="w-2") == ["limited"]


def test_the_plain_claim_never_takes_from_a_limited_queue(worker_connection: Any) -> None:
    """A worker that does not know of the limit yet (it reads them each poll interval) takes
    nothing of the queue: its plain claim leaves limited queues alone."""
    JobFactory.create_batch(3, queue="limited")
    set_queue_limits("limited", concurrency=1)
    assert claim(worker_connection, 10, limited=[]) == []
    assert claim(worker_connection, 10, limited=["limited"]) == ["limited"]


def test_a_lifted_limit_goes_back_to_the_plain_claim(worker_connection: Any) -> None:
    JobFactory.create_batch(3, queue="limited")
    set_queue_limits("limited", concurrency=1)
    set_queue_limits("limited")
    # A worker still sending the limited claim takes it all, as the plain claim does.
    assert claim(worker_connection, 10, limited=["limited"]) == ["limited"] * 3


def test_a_paused_limited_queue_gives_nothing(worker_connection: Any) -> None:
    JobFactory.create_batch(3, queue="limited")
    set_queue_limits("limited", concurrency=2)
    set_queue_paused("limited", paused=True)
    assert claim(worker_connection, 10, limited=["limited"]) == []
    set_queue_paused("limited", paused=False)
    assert claim(worker_connection, 10, limited=["limited"]) == ["limited"] * 2


def test_a_rate_starts_at_most_its_burst_then_refills(worker_connection: Any) -> None:
    JobFactory.create_batch(50, queue="limited")
    set_queue_limits("limited", rate="10/s", burst=4)
    assert claim(worker_connection, 20, limited=["limited"]) == ["limited"] * 4
    assert claim(worker_connection, 20, limited=["limited"]) == []
    time.sleep(0.35)  # 3.5 tokens
    assert claim(worker_connection, 20, limited=["limited"]) == ["limited"] * 3
    time.sleep(2)  # the bucket holds its burst at most, however long the quiet
    assert claim(worker_connection, 20, limited=["limited"]) == ["limited"] * 4


def test_a_worker_serving_other_queues_sends_no_limited_claim() -> None:
    set_queue_limits("limited", concurrency=1)
    runner = PassRunner(worker_id="w-1", queues=["default"], wake=lambda: None)
    runner.connect()
    try:
        runner.run(Pass(outcomes=[], renew=[], promote=False, claim=1, touch=[]))
        assert runner.limited == []
        everywhere = PassRunner(worker_id="w-2", queues=None, wake=lambda: None)
        everywhere.connect()
        everywhere.run(Pass(outcomes=[], renew=[], promote=False, claim=1, touch=[]))
        assert everywhere.limited == ["limited"]
        assert everywhere.connection is not None
        everywhere.connection.close()
    finally:
        assert runner.connection is not None
        runner.connection.close()


def test_concurrent_claimers_never_exceed_the_limit() -> None:
    """Eight connections claim and finish as fast as they can; a ninth samples the running
    jobs of the queue all along."""
    JobFactory.create_batch(400, queue="limited")
    set_queue_limits("limited", concurrency=3)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def claimer(number: int) -> None:
        try:
            with connect() as conn:
                while not stop.is_set():
                    for _ in claim(conn, 2, limited=["limited"], worker=f"w-{number}"):
                        pass
                    with conn.transaction():
                        conn.execute(
                            "UPDATE eddyq_jobs SET state = 'completed', locked_by = NULL "
                            "WHERE locked_by = %s AND state = 'running'",
                            [f"w-{number}"],
                        )
        except BaseException as error:
            errors.append(error)

    def sampler() -> None:
        with connect() as conn:
            conn.autocommit = True
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM eddyq_jobs WHERE queue = 'limited' AND state = 'running'"
                ).fetchone()
                assert row is not None
                seen.append(row[0])

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    threads.append(threading.Thread(target=sampler))
    for thread in threads:
        thread.start()
    wait_for(lambda: not Job.objects.filter(queue="limited", state="available").exists(), 60)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert not errors
    assert seen and max(seen) <= 3
    assert Job.objects.filter(queue="limited", state="completed").count() == 400


# Real workers.


@pytest.fixture
def start_workers(start_worker: StartWorker) -> None:
    """Four worker processes of concurrency 10, for every example of a test."""
    for _ in range(4):
        start_worker("--concurrency", "10", "--no-maintenance")


OVERLAP = """
SELECT COALESCE(max(running), 0) FROM (
    SELECT sum(delta) OVER (ORDER BY at, delta, id) AS running
    FROM (
        SELECT id, created_at AS at, CASE WHEN label = 'start' THEN 1 ELSE -1 END AS delta
        FROM demo_execution WHERE label IN ('start', 'end')
    ) AS event
) AS timeline
"""


def max_overlap() -> int:
    with connection.cursor() as cursor:
        cursor.execute(OVERLAP)
        (overlap,) = cursor.fetchone()
    return int(overlap)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    limit=st.integers(1, 6),
    durations=st.lists(st.sampled_from([0.0, 0.005, 0.02, 0.05]), min_size=10, max_size=40),
)
def test_four_workers_never_run_more_than_the_limit(
    start_workers: None, limit: int, durations: list[float]
) -> None:
    """Four worker processes of concurrency 10 drain a queue limited to ``limit``; each run
    records its start and end in the database (by its clock, in the handler's own statements):
    at no instant do more than ``limit`` runs overlap."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM demo_execution")
    Job.all_objects.filter(queue="limited").delete()
    set_queue_limits("limited", concurrency=limit)
    jobs.overlap.using(queue="limited").enqueue_many([(seconds,) for seconds in durations])
    wait_for(
        lambda: Job.objects.filter(queue="limited", state="completed").count() == len(durations),
        60,
    )
    overlap = max_overlap()
    assert 1 <= overlap <= limit


class RunningSampler(threading.Thread):
    """Counts the running jobs of a queue, from the database, as often as it can."""

    def __init__(self, queue: str) -> None:
        super().__init__()
        self.queue = queue
        self.most = 0
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        with connect() as conn:
            while not self.done.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM eddyq_jobs WHERE queue = %s AND state = 'running'",
                    [self.queue],
                ).fetchone()
                assert row is not None
                self.most = max(self.most, row[0])
                self.samples += 1
                time.sleep(0.01)

    def __enter__(self) -> RunningSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join(10)


def test_a_killed_worker_holds_its_slots_until_its_jobs_are_rescued(
    start_worker: StartWorker, worker_environment: dict[str, str]
) -> None:
    """A worker holding both slots of a queue is SIGKILLed: no other worker starts one of the
    queue's jobs until the rescuer has taken them back, then they all run; a pause in the
    middle starts nothing."""
    set_queue_limits("limited", concurrency=2)
    jobs.overlap.using(queue="limited").enqueue_many([(1.5,) for _ in range(6)])
    with RunningSampler("limited") as sampler:
        doomed = start_worker("--concurrency", "10", "--no-maintenance")
        wait_for(lambda: Job.objects.filter(queue="limited", state="running").count() == 2, 30)
        doomed.kill()
        doomed.wait(10)
        worker_environment["EDDYQ_RESCUE_INTERVAL"] = "500ms"
        worker_environment["EDDYQ_SCHEDULER_INTERVAL"] = "200ms"
        start_worker("--concurrency", "10")
        time.sleep(1)
        # Still running, by the database's account: nothing else of the queue started.
        assert Job.objects.filter(queue="limited", state="running").count() == 2
        assert not Job.objects.filter(queue="limited", attempt=1, state="completed").exists()
        wait_for(lambda: Job.objects.filter(queue="limited", state="completed").exists(), 30)
        set_queue_paused("limited", paused=True)
        wait_for(lambda: not Job.objects.filter(queue="limited", state="running").exists(), 30)
        left = Job.objects.filter(queue="limited", state="available").count()
        time.sleep(0.5)
        assert Job.objects.filter(queue="limited", state="available").count() == left
        set_queue_paused("limited", paused=False)
        wait_for(lambda: Job.objects.filter(queue="limited", state="completed").count() == 6, 60)
    assert sampler.samples > 100
    assert sampler.most == 2


def test_four_workers_keep_to_a_rate(start_workers: None) -> None:
    """Four worker processes drain a queue limited to 20 a second: the jobs claimed over 15
    seconds are the rate's, within 5 %, and no second holds more than the bucket and its
    refill.

    Claims are counted, by their time in the database (``attempted_at``), rather than the
    handlers' starts: on a loaded machine a worker process may stall for a moment and start a
    second's worth of jobs at once, which says nothing of the limit. That a burst never
    exceeds the bucket is proved, to the job, by ``test_a_rate_starts_at_most_its_burst``."""
    set_queue_limits("limited", rate="20/s")
    jobs.overlap.using(queue="limited").enqueue_many([(0.0,) for _ in range(600)])
    wait_for(lambda: Job.objects.filter(queue="limited", state="completed").exists(), 30)
    time.sleep(15.5)  # the window, from the first claim, is over
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH claim AS (
                SELECT attempted_at AS at FROM eddyq_jobs
                WHERE queue = 'limited' AND attempted_at IS NOT NULL
            ), first AS (SELECT min(at) AS at FROM claim)
            SELECT count(*) FILTER (WHERE claim.at < first.at + interval '15 seconds'),
                   (SELECT max(n) FROM (
                        SELECT count(*) AS n
                        FROM claim AS other, (SELECT DISTINCT at FROM claim) AS one
                        WHERE other.at >= one.at AND other.at < one.at + interval '1 second'
                        GROUP BY one.at) AS windows)
            FROM claim, first
            """
        )
        claimed, busiest_second = cursor.fetchone()
    # A full bucket (20) at first, then 20 a second: 320 at most in 15 seconds. In any second,
    # the bucket and the second's refill (40), give or take a pass that waited for the lock
    # (its claims carry the time its transaction began).
    assert 285 <= claimed <= 320
    assert busiest_second <= 48


def test_the_limited_claim_leaves_out_other_queues_that_had_nothing_until_told() -> None:
    """Once the other queues gave nothing, the limited claim stops reading past the limited
    queue's backlog for them, until new jobs are announced (or a poll interval passes)."""
    JobFactory.create_batch(5, queue="limited")
    set_queue_limits("limited", concurrency=1)
    runner = PassRunner(worker_id="w-1", queues=None, wake=lambda: None)
    runner.connect()

    def claimed() -> list[str]:
        done = runner.run(Pass(outcomes=[], renew=[], promote=False, claim=4, touch=[]))
        return sorted(job.queue for job in done.claimed)

    try:
        assert claimed() == ["limited"]  # the others gave nothing
        JobFactory(queue="default")
        assert claimed() == []  # not read for them
        runner.jobs_notified("limited")
        assert claimed() == []  # a limited queue's news changes nothing
        runner.jobs_notified("default")
        assert claimed() == ["default"]
    finally:
        assert runner.connection is not None
        runner.connection.close()
