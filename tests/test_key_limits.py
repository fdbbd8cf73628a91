"""Flow control per key: a task's concurrency and rate per key of its jobs, as declared, as
enqueued (the key on the row), as the keyed claim enforces them (the worker's own pass against
real PostgreSQL), and across real worker processes (the overlap of runs per key, computed from
what the handlers recorded in the database)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_eddyq import set_queue_limits, task
from django_eddyq.limits import MAX_KEY_LENGTH, Limits, Rate
from django_eddyq.maintenance.queue_cleaner import QueueCleaner
from django_eddyq.models import Job, RateBucket
from django_eddyq.operations import set_queue_paused
from django_eddyq.testing import run_jobs
from django_eddyq.worker.passes import KeyedTasks, Pass, PassRunner, connect, run_pass
from tests import jobs
from tests.processes import StartWorker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


# As declared and enqueued.


def test_a_task_limited_per_key_declares_its_limits() -> None:
    assert jobs.one_per_customer.limits == Limits(concurrency=1)
    assert jobs.customer_rate.limits == Limits(rate=Rate(10, 1.0, 2))
    assert jobs.add.limits is None
    keyed = KeyedTasks.declared()
    assert keyed is not None
    assert jobs.one_per_customer.path in keyed.paths
    assert jobs.add.path not in keyed.paths


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"key": lambda x: x}, ValueError, "has a key but no limit"),
        ({"concurrency": 0}, ValueError, "concurrency must be an integer"),
        ({"rate": "often"}, ValueError, "rate 'often' is invalid"),
        ({"burst": 2}, ValueError, "burst is given without a rate"),
        ({"concurrency": 1, "key": "customer_id"}, TypeError, "must be a function"),
    ],
)
def test_bad_limits_are_refused_as_the_task_is_declared(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    def limited(x: int) -> None:
        """Never declared."""

    with pytest.raises(error, match=message) as raised:
        task(**options)(limited)
    assert "limited" in str(raised.value)  # the task is named


def test_the_key_is_stored_on_the_job() -> None:
    job = jobs.one_per_customer.enqueue(0.0, "acme")
    assert Job.objects.get(pk=job.pk).limit_key == "acme" == job.limit_key
    whole = jobs.one_at_a_time.enqueue(0.0)
    assert Job.objects.get(pk=whole.pk).limit_key == ""
    assert Job.objects.get(pk=jobs.add.enqueue(1, 2).pk).limit_key is None


def test_the_key_function_gets_the_arguments_by_name() -> None:
    """However the call passes them, and with the task's defaults."""

    def regional(account: str, region: str = "eu", **options: Any) -> None:
        """Never run."""

    keyed = task(concurrency=1, key=lambda region, **_: region)(regional)
    assert keyed.enqueue("acme").limit_key == "eu"
    assert keyed.enqueue("acme", "us").limit_key == "us"
    assert keyed.enqueue(account="acme", region="ap", retries=3).limit_key == "ap"
    by_option = task(concurrency=1, key=lambda retries, **_: retries)(regional)
    assert by_option.enqueue("acme", retries=3).limit_key == "3"


def test_many_jobs_each_get_their_key() -> None:
    """Past COPY's threshold too: a keyed task's jobs go through the insert that stores keys."""
    calls = [(0.0, f"customer-{n % 7}") for n in range(1200)]
    enqueued = jobs.one_per_customer.enqueue_many(calls)
    stored = dict(
        Job.objects.filter(task=jobs.one_per_customer.path).values_list("id", "limit_key")
    )
    assert [stored[job.pk] for job in enqueued] == [customer for _, customer in calls]


@pytest.mark.parametrize(
    ("customer", "error", "message"),
    [
        (1.5, TypeError, "must be a string or an integer, not float"),
        (None, TypeError, "must be a string or an integer, not NoneType"),
        ("x" * (MAX_KEY_LENGTH + 1), ValueError, "more than 200"),
    ],
)
def test_a_bad_key_is_refused_at_enqueue(
    customer: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as raised:
        jobs.one_per_customer.enqueue(0.0, customer)
    assert jobs.one_per_customer.path in str(raised.value)
    assert not Job.objects.exists()


def test_a_key_holding_nul_is_refused_at_enqueue() -> None:
    def keyed_by_nul(x: int) -> None:
        """Its key is text PostgreSQL cannot store."""

    keyed = task(concurrency=1, key=lambda x: f"a\x00{x}")(keyed_by_nul)
    with pytest.raises(ValueError, match="keyed_by_nul holds a NUL character"):
        keyed.enqueue(1)
    assert not Job.objects.exists()


def test_a_key_function_that_fails_names_the_task() -> None:
    with pytest.raises(TypeError, match=r"the key of task tests\.jobs\.one_per_customer failed"):
        jobs.one_per_customer.enqueue(0.0)  # the key function misses its customer
    assert not Job.objects.exists()


# The claim, as a worker's pass sends it.


@pytest.fixture
def worker_connection() -> Iterator[psycopg.Connection[Any]]:
    with connect() as conn:
        yield conn


def claim(
    conn: psycopg.Connection[Any],
    limit: int,
    *,
    worker: str = "w-1",
    queues: list[str] | None = None,
    keyed: bool = True,
) -> list[tuple[str, int]]:
    """The (key, id) of the jobs one pass claims, in claim order."""
    done = run_pass(
        conn,
        Pass(outcomes=[], renew=[], promote=False, claim=limit, touch=[]),
        worker_id=worker,
        lease_seconds=60,
        queues=queues,
        keyed=KeyedTasks.declared() if keyed else None,
    )
    keys = dict(
        Job.objects.filter(pk__in=[job.id for job in done.claimed]).values_list("id", "limit_key")
    )
    return [(keys[job.id], job.id) for job in done.claimed]


def keys_of(claimed: list[tuple[str, int]]) -> list[str]:
    return sorted(key for key, _id in claimed)


def finish(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(state="completed", locked_by=None)


def test_a_long_backlog_of_one_key_never_holds_up_another(worker_connection: Any) -> None:
    """10,000 jobs of key A wait at limit 1; a job of key B enqueued after them all is taken
    by the very next claim, and A gives one job at a time."""
    jobs.one_per_customer.enqueue_many([(0.0, "A") for _ in range(10_000)])
    late = jobs.one_per_customer.enqueue(0.0, "B")
    first = claim(worker_connection, 10)
    assert keys_of(first) == ["A", "B"]
    assert late.pk in {job_id for _key, job_id in first}
    assert claim(worker_connection, 10) == []
    a_job = next(job_id for key, job_id in first if key == "A")
    finish(a_job)
    second = claim(worker_connection, 10, worker="w-2")
    assert keys_of(second) == ["A"]
    assert second[0][1] == a_job + 1  # the key's next job, in enqueue order


def test_a_key_limit_counts_the_running_jobs(worker_connection: Any) -> None:
    jobs.two_per_customer.enqueue_many([(0.0, key) for key in "AAAAABBC"])
    assert keys_of(claim(worker_connection, 10)) == ["A", "A", "B", "B", "C"]
    assert claim(worker_connection, 10) == []


def test_a_key_takes_its_jobs_in_priority_order(worker_connection: Any) -> None:
    low = jobs.one_per_customer.enqueue(0.0, "A")
    high = jobs.one_per_customer.using(priority=10).enqueue(0.0, "A")
    assert claim(worker_connection, 10) == [("A", high.pk)]
    finish(high.pk)
    assert claim(worker_connection, 10) == [("A", low.pk)]


def test_keys_are_taken_in_claim_order_across_keys(worker_connection: Any) -> None:
    """With fewer slots than keys, the best jobs (priority, then age) of the keys with room."""
    jobs.one_per_customer.enqueue(0.0, "C")
    urgent = jobs.one_per_customer.using(priority=5).enqueue(0.0, "Z")
    oldest = jobs.one_per_customer.enqueue_many([(0.0, "M"), (0.0, "A")])
    taken = [job_id for _key, job_id in claim(worker_connection, 2)]
    assert taken == [urgent.pk, Job.objects.get(limit_key="C").pk]
    assert oldest  # M and A wait for the next claim
    assert keys_of(claim(worker_connection, 5)) == ["A", "M"]


def test_a_task_limited_as_a_whole(worker_connection: Any) -> None:
    jobs.one_at_a_time.enqueue_many([(0.0,) for _ in range(3)])
    assert keys_of(claim(worker_connection, 10)) == [""]
    assert claim(worker_connection, 10) == []


def test_the_plain_claim_never_takes_a_keyed_job(worker_connection: Any) -> None:
    """A worker that does not send the keyed claim (it knows no such task) leaves them."""
    jobs.one_per_customer.enqueue(0.0, "A")
    plain = jobs.add.enqueue(1, 2)
    assert claim(worker_connection, 10, keyed=False) == [(None, plain.pk)]
    assert keys_of(claim(worker_connection, 10)) == ["A"]


def test_the_keyed_claim_keeps_to_the_workers_queues(worker_connection: Any) -> None:
    jobs.one_per_customer.using(queue="imports").enqueue(0.0, "A")
    jobs.one_per_customer.enqueue(0.0, "B")
    assert keys_of(claim(worker_connection, 10, queues=["imports"])) == ["A"]
    assert keys_of(claim(worker_connection, 10, queues=["default", "other"])) == ["B"]


def test_a_paused_queue_gives_no_keyed_job(worker_connection: Any) -> None:
    jobs.one_per_customer.using(queue="imports").enqueue(0.0, "A")
    set_queue_paused("imports", paused=True)
    assert claim(worker_connection, 10) == []
    set_queue_paused("imports", paused=False)
    assert keys_of(claim(worker_connection, 10)) == ["A"]


def test_a_rate_per_key_starts_at_most_its_burst_then_refills(worker_connection: Any) -> None:
    """10 a second with a burst of 2, per customer: each key has its own bucket. How many a
    later claim may take follows from the time between the claims by the database's clock,
    which the buckets record: a busy machine changes how many, never whether the count holds."""
    jobs.customer_rate.enqueue_many([(key,) for key in "AB" for _ in range(20)])
    assert keys_of(claim(worker_connection, 20)) == ["A", "A", "B", "B"]
    buckets = RateBucket.objects.filter(name__startswith="task:tests.jobs.customer_rate:")
    assert sorted(buckets.values_list("name", flat=True)) == [
        "task:tests.jobs.customer_rate:A",
        "task:tests.jobs.customer_rate:B",
    ]
    emptied = buckets.get(name__endswith=":A")
    assert emptied.tokens == 0
    time.sleep(0.15)  # 1.5 tokens each, or more on a busy machine
    taken = keys_of(claim(worker_connection, 20))
    bucket = buckets.get(name__endswith=":A")
    earned = min(2.0, (bucket.refilled_at - emptied.refilled_at).total_seconds() * 10)
    assert earned >= 1.5
    assert taken == ["A"] * int(earned) + ["B"] * int(earned)
    assert bucket.tokens == pytest.approx(earned - int(earned), abs=1e-6)
    # Full again once the tokens it lacks have come in, at 10 a second.
    assert bucket.full_at is not None
    assert (bucket.full_at - bucket.refilled_at).total_seconds() == pytest.approx(
        (2 - bucket.tokens) / 10, abs=1e-3
    )


def test_the_queue_cleaner_forgets_buckets_full_again(worker_connection: Any) -> None:
    jobs.customer_rate.enqueue_many([(key,) for key in "AB"])
    claim(worker_connection, 20)
    assert RateBucket.objects.count() == 2
    QueueCleaner().run_once(now=timezone.now())
    assert RateBucket.objects.count() == 2  # not full yet
    QueueCleaner().run_once(now=timezone.now() + timedelta(seconds=1))
    assert not RateBucket.objects.exists()


def test_a_worker_leaves_out_the_keyed_claim_until_told_of_new_jobs() -> None:
    """A worker declaring keyed tasks sends their claim (and takes their locks) only while it
    may find something: after a claim that found no keyed job, not until a job is announced in
    a queue keyed jobs go to (or a poll interval passes)."""
    runner = PassRunner(worker_id="w-1", queues=None, wake=lambda: None)
    runner.connect()
    try:
        empty = Pass(outcomes=[], renew=[], promote=False, claim=5, touch=[])
        runner.run(empty)
        assert runner._keyed_idle
        jobs.one_per_customer.enqueue(0.0, "A")
        runner.run(Pass(outcomes=[], renew=[], promote=False, claim=5, touch=[]))
        assert not Job.objects.filter(state="running").exists()  # not told yet
        runner.jobs_notified("emails")  # a queue no keyed task declares
        runner.run(Pass(outcomes=[], renew=[], promote=False, claim=5, touch=[]))
        assert not Job.objects.filter(state="running").exists()
        runner.jobs_notified("default")
        done = runner.run(Pass(outcomes=[], renew=[], promote=False, claim=5, touch=[]))
        assert [job.task for job in done.claimed] == [jobs.one_per_customer.path]
    finally:
        assert runner.connection is not None
        runner.connection.close()


def test_concurrent_claimers_never_exceed_a_key_limit() -> None:
    """Eight connections claim and finish as fast as they can, each locking the keys it takes
    from without waiting for the others; a ninth samples the running jobs per key all along."""
    jobs.two_per_customer.enqueue_many([(0.0, f"k{n % 5}") for n in range(400)])
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def claimer(number: int) -> None:
        try:
            with connect() as conn:
                while not stop.is_set():
                    claim(conn, 3, worker=f"w-{number}")
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
                    "SELECT COALESCE(max(running), 0) FROM (SELECT count(*) AS running"
                    " FROM eddyq_jobs WHERE state = 'running' GROUP BY limit_key) AS per_key"
                ).fetchone()
                assert row is not None
                seen.append(row[0])

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    threads.append(threading.Thread(target=sampler))
    for thread in threads:
        thread.start()
    wait_for(lambda: not Job.objects.filter(state__in=["available", "running"]).exists(), 60)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert not errors
    assert seen and max(seen) <= 2
    assert Job.objects.filter(state="completed").count() == 400


def test_run_jobs_keeps_to_the_limits_and_runs_every_job() -> None:
    """In tests, ``run_jobs`` claims as a worker does: a key's jobs one at a time, round after
    round, until all have run."""
    jobs.one_per_customer.enqueue_many([(0.0, key) for key in "AAB"])
    set_queue_limits("limited", concurrency=1)
    jobs.add.using(queue="limited").enqueue_many([(1, 2), (3, 4)])
    ran = run_jobs()
    assert len(ran) == 5
    assert {job.state for job in ran} == {"completed"}


# Real workers.


@pytest.fixture
def start_workers(start_worker: StartWorker) -> None:
    """Four worker processes of concurrency 10, for every example of a test."""
    for _ in range(4):
        start_worker("--concurrency", "10", "--no-maintenance")


OVERLAP_PER_KEY = """
SELECT job.limit_key, COALESCE(max(timeline.running), 0) FROM (
    SELECT job_id, sum(delta) OVER (PARTITION BY key ORDER BY at, delta, id) AS running
    FROM (
        SELECT run.id, run.job_id, run.created_at AS at, job.limit_key AS key,
               CASE WHEN run.label = 'start' THEN 1 ELSE -1 END AS delta
        FROM demo_execution AS run JOIN eddyq_jobs AS job ON job.id = run.job_id
        WHERE run.label IN ('start', 'end')
          -- A run killed before its end (rescued, and run again) is left out.
          AND EXISTS (
              SELECT FROM demo_execution AS ended
              WHERE ended.label = 'end' AND ended.job_id = run.job_id AND ended.pid = run.pid
          )
    ) AS event
) AS timeline JOIN eddyq_jobs AS job ON job.id = timeline.job_id
GROUP BY job.limit_key
"""


def overlap_per_key() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(OVERLAP_PER_KEY)
        return {key: int(most) for key, most in cursor.fetchall()}


LIMITED = {1: jobs.one_per_customer, 2: jobs.two_per_customer, 3: jobs.three_per_customer}


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    limit=st.sampled_from(sorted(LIMITED)),
    runs=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from([0.0, 0.01, 0.03])),
        min_size=10,
        max_size=40,
    ),
)
def test_four_workers_never_run_more_than_the_limit_per_key(
    start_workers: None, limit: int, runs: list[tuple[str, float]]
) -> None:
    """Four worker processes of concurrency 10 drain jobs of a few keys at a hypothesis-chosen
    limit per key; each run records its start and end in the database, by its clock: at no
    instant do more than ``limit`` runs of one key overlap."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM demo_execution")
    Job.all_objects.all().delete()
    limited = LIMITED[limit]
    limited.enqueue_many([(seconds, key) for key, seconds in runs])
    wait_for(lambda: Job.objects.filter(state="completed").count() == len(runs), 60)
    overlaps = overlap_per_key()
    assert set(overlaps) == {key for key, _seconds in runs}
    assert all(1 <= most <= limit for most in overlaps.values()), overlaps


def test_a_killed_worker_holds_its_keys_until_its_jobs_are_rescued(
    start_worker: StartWorker, worker_environment: dict[str, str]
) -> None:
    """A worker running key A's only slot is SIGKILLed: no other worker starts a job of A
    until the rescuer has taken it back, while key B's jobs run on; then A's all run, one at a
    time, a pause of their queue in the middle starting none."""
    jobs.one_per_customer.enqueue(1.5, "A")
    doomed = start_worker("--concurrency", "10", "--no-maintenance")
    wait_for(lambda: Job.objects.filter(limit_key="A", state="running").exists(), 30)
    jobs.one_per_customer.enqueue_many([(0.2, "A") for _ in range(3)])
    doomed.kill()
    doomed.wait(10)
    worker_environment["EDDYQ_RESCUE_INTERVAL"] = "500ms"
    worker_environment["EDDYQ_SCHEDULER_INTERVAL"] = "200ms"
    start_worker("--concurrency", "10")
    jobs.one_per_customer.enqueue_many([(0.0, "B") for _ in range(3)])
    wait_for(lambda: Job.objects.filter(limit_key="B", state="completed").count() == 3, 30)
    # A's job is still running, by the database's account: nothing else of A started.
    assert Job.objects.filter(limit_key="A", state="running").count() == 1
    assert not Job.objects.filter(limit_key="A", state="completed").exists()
    wait_for(lambda: Job.objects.filter(limit_key="A", state="completed").exists(), 60)
    set_queue_paused("default", paused=True)
    wait_for(lambda: not Job.objects.filter(state="running").exists(), 30)
    left = Job.objects.filter(limit_key="A", state="available").count()
    assert left >= 1  # A's jobs run one at a time, 0.2 s each: some wait still
    time.sleep(0.5)
    assert Job.objects.filter(limit_key="A", state="available").count() == left
    set_queue_paused("default", paused=False)
    wait_for(lambda: Job.objects.filter(limit_key="A", state="completed").count() == 4, 60)
    assert overlap_per_key()["A"] == 1


def test_four_workers_keep_each_key_to_its_rate(start_workers: None) -> None:
    """Four worker processes drain two customers' jobs limited to 10 a second each (a burst of
    2): over 6 seconds from each key's first claim, each key's claims (by their time in the
    database) are its rate's, within 5 %, and no second of a key holds more than its bucket and
    its refill."""
    jobs.customer_rate.enqueue_many([(key,) for key in "AB" for _ in range(200)])
    wait_for(lambda: Job.objects.filter(state="completed").count() >= 2, 30)
    time.sleep(6.5)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH claim AS (
                SELECT limit_key AS key, attempted_at AS at FROM eddyq_jobs
                WHERE attempted_at IS NOT NULL
            ), first AS (SELECT key, min(at) AS at FROM claim GROUP BY key)
            SELECT claim.key,
                   count(*) FILTER (WHERE claim.at < first.at + interval '6 seconds'),
                   (SELECT max(n) FROM (
                        SELECT count(*) AS n
                        FROM claim AS other, (SELECT DISTINCT at FROM claim AS c
                                              WHERE c.key = claim.key) AS one
                        WHERE other.key = claim.key
                          AND other.at >= one.at AND other.at < one.at + interval '1 second'
                        GROUP BY one.at) AS windows)
            FROM claim JOIN first USING (key)
            GROUP BY claim.key
            ORDER BY claim.key
            """
        )
        rows = cursor.fetchall()
    assert [key for key, _claimed, _busiest in rows] == ["A", "B"]
    for _key, claimed, busiest in rows:
        # The bucket (2) at first, then 10 a second: 62 at most in 6 seconds.
        assert 57 <= claimed <= 62
        assert busiest <= 2 + 10 + 1
