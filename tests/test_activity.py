"""The activity counters: written by real worker passes, sampled, folded and pruned by the
activity sampler with an injected ``now``, and read back zero-filled."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from django_eddyq.activity import activity, recent_counts
from django_eddyq.maintenance.activity import COUNT_LIMIT, ActivitySampler
from django_eddyq.models import Activity, Job
from django_eddyq.worker import Worker
from tests import jobs
from tests.factories import JobFactory, QueueFactory

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
# A fixed time, past the half hour: the last hour's window then spans two clock hours.
NOW = datetime(2030, 5, 6, 12, 34, 56, tzinfo=UTC)


def database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    assert isinstance(now, datetime)
    return now


def add_row(minute: datetime, queue: str = "default", source: str = "w1", **counts: Any) -> None:
    Activity.objects.create(minute=minute, queue=queue, source=source, **counts)


def rows() -> list[tuple[Any, ...]]:
    return list(
        Activity.objects.order_by("minute", "queue", "source").values_list(
            "minute", "queue", "source", "completed", "failed", "retried", "available"
        )
    )


def test_worker_passes_count_what_they_finished(run_burst_worker: RunWorker) -> None:
    for number in range(7):
        jobs.add.enqueue(number, 1)
    for _ in range(3):
        jobs.always_fails.enqueue("retried")  # max_attempts 3: retryable after the first
    for _ in range(2):
        jobs.discard.enqueue("failed")  # failed at once
    jobs.send_email.enqueue("a@example.com")  # queue "emails"
    jobs.snoozes_for.enqueue("3600")
    before = database_now()
    worker = run_burst_worker(concurrency=2)
    after = database_now()
    assert worker.processed == 14
    counted = list(
        Activity.objects.values_list(
            "minute", "queue", "source", "completed", "failed", "retried", "cancelled", "snoozed"
        ).order_by("queue")
    )
    # One row per queue of the worker's minute (a second row only if the run crossed a minute).
    minutes = {row[0] for row in counted}
    assert minutes <= {moment.replace(second=0, microsecond=0) for moment in (before, after)}
    assert {row[2] for row in counted} == {worker.id}
    totals: dict[str, list[int]] = {}
    for _minute, queue, _source, *counts in counted:
        totals[queue] = [a + b for a, b in zip(totals.get(queue, [0] * 5), counts, strict=True)]
    assert totals == {"default": [7, 2, 3, 0, 1], "emails": [1, 0, 0, 0, 0]}
    if len(minutes) == 1:
        assert len(counted) == 2


def test_a_fenced_out_outcome_is_not_counted(run_burst_worker: RunWorker) -> None:
    """Only the outcomes FINISH_JOBS wrote count: a job rescued from under its worker is the
    rescuer's to count."""
    job = jobs.sleep.enqueue(0.5)

    def take_it_away() -> None:
        Job.objects.filter(pk=job.pk).update(locked_by="someone else")

    import threading

    timer = threading.Timer(0.2, take_it_away)
    timer.start()
    run_burst_worker(concurrency=1)
    timer.join()
    assert Activity.objects.count() == 0


def test_a_second_pass_in_the_minute_adds_to_the_workers_row(run_burst_worker: RunWorker) -> None:
    jobs.add.enqueue(1, 1)
    first = run_burst_worker()
    jobs.add.enqueue(2, 2)
    second = run_burst_worker()
    by_source = dict(Activity.objects.values_list("source", "completed"))
    assert by_source == {first.id: 1, second.id: 1}


def test_the_rescuer_counts_what_it_rescued() -> None:
    from django_eddyq.maintenance.rescuer import Rescuer

    now = database_now()
    JobFactory(
        state=Job.State.RUNNING,
        attempt=1,
        locked_by="gone",
        locked_until=now - MINUTE,
        attempted_at=now - HOUR,
    )
    JobFactory(
        state=Job.State.RUNNING,
        attempt=25,
        locked_by="gone",
        locked_until=now - MINUTE,
        attempted_at=now - HOUR,
    )
    assert Rescuer().run_once(now=now) == 2
    [(source, failed, retried)] = Activity.objects.values_list("source", "failed", "retried")
    assert (source, failed, retried) == ("rescuer", 1, 1)


def test_the_sampler_writes_each_queues_depth_once_a_minute() -> None:
    QueueFactory(name="busy")
    QueueFactory(name="idle")
    for _ in range(3):
        JobFactory(queue="busy")
    JobFactory(queue="busy", state=Job.State.RUNNING, locked_by="w", attempt=1)
    ActivitySampler().run_once(now=NOW)
    JobFactory(queue="busy")
    ActivitySampler().run_once(now=NOW + timedelta(seconds=3))  # the same minute: overwritten
    minute = NOW.replace(second=0)
    assert rows() == [
        (minute, "busy", "sampler", 0, 0, 0, 4),
        (minute, "idle", "sampler", 0, 0, 0, 0),
    ]


def test_past_the_count_limit_a_depth_is_estimated(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_eddyq.maintenance import activity as sampler_module

    monkeypatch.setattr(sampler_module, "COUNT_LIMIT", 2)
    QueueFactory(name="deep")
    QueueFactory(name="shallow")
    JobFactory.create_batch(5, queue="deep")
    JobFactory(queue="shallow")
    ActivitySampler().run_once(now=NOW)
    depth = dict(Activity.objects.values_list("queue", "available"))
    # No statistics yet: the deep queue is known to hold more than the limit, no more.
    assert depth == {"deep": 3, "shallow": 1}
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE eddyq_jobs")
    ActivitySampler().run_once(now=NOW)
    depth = dict(Activity.objects.values_list("queue", "available"))
    assert depth == {"deep": 5, "shallow": 1}
    assert COUNT_LIMIT == 10_000


def test_hours_before_the_last_are_folded_into_a_row_per_queue() -> None:
    hour = NOW.replace(minute=0, second=0) - 2 * HOUR  # 10:00; the last hour began at 11:34
    add_row(hour + MINUTE, completed=2, failed=1)
    add_row(hour + 59 * MINUTE, source="w2", completed=3, retried=4)
    add_row(hour + 5 * MINUTE, source="sampler", available=7)
    add_row(hour + 6 * MINUTE, source="sampler", available=9)
    add_row(hour + 7 * MINUTE, queue="other", source="sampler", available=1)
    add_row(hour - HOUR, completed=1)  # 09:00
    recent = [
        (hour + HOUR + 33 * MINUTE, "w1"),  # 11:33: before the last hour, in an unfinished hour
        (hour + HOUR + 35 * MINUTE, "w1"),
    ]
    for minute, source in recent:
        add_row(minute, source=source, completed=1)
    assert ActivitySampler().run_once(now=NOW) == 6
    assert rows() == [
        (hour - HOUR, "default", "hour", 1, 0, 0, None),
        (hour, "default", "hour", 5, 1, 4, 9),
        (hour, "other", "hour", 0, 0, 0, 1),
        (recent[0][0], "default", "w1", 1, 0, 0, None),
        (recent[1][0], "default", "w1", 1, 0, 0, None),
    ]
    # A late row of a folded hour is added to its row at the next pass.
    add_row(hour + 2 * MINUTE, completed=10)
    add_row(hour + 3 * MINUTE, source="sampler", available=20)
    assert ActivitySampler().run_once(now=NOW) == 2
    assert rows()[1] == (hour, "default", "hour", 15, 1, 4, 20)


def test_rows_past_the_retention_are_deleted(settings: Any) -> None:
    settings.EDDYQ = {"ACTIVITY_RETENTION": "2d"}
    ActivitySampler.batch_size = 2
    try:
        for hours in (49, 50, 51, 60, 70):
            add_row(NOW - hours * HOUR, source="hour", completed=1)
        add_row(NOW - 47 * HOUR, source="hour", completed=1)
        assert ActivitySampler().run_once(now=NOW) == 5
    finally:
        ActivitySampler.batch_size = 10_000
    assert [row[0] for row in rows() if row[2] == "hour"] == [NOW - 47 * HOUR]


def test_no_retention_keeps_every_row(settings: Any) -> None:
    settings.EDDYQ = {"ACTIVITY_RETENTION": None}
    add_row(NOW - 400 * 24 * HOUR, source="hour", completed=1)
    assert ActivitySampler().run_once(now=NOW) == 0
    assert Activity.objects.filter(source="hour").count() == 1


def test_the_last_hour_per_minute_is_zero_filled() -> None:
    minute = NOW.replace(second=0)
    add_row(minute, completed=2, failed=1)
    add_row(minute, source="w2", completed=3, retried=1)
    add_row(minute - 59 * MINUTE, completed=1)
    add_row(minute - 60 * MINUTE, completed=100)  # before the window
    add_row(minute - 10 * MINUTE, source="sampler", available=4)
    add_row(minute - 10 * MINUTE, queue="other", source="sampler", available=6)
    add_row(minute - 10 * MINUTE, queue="other", completed=1)
    series = activity(HOUR, MINUTE, now=NOW)
    assert len(series.buckets) == 60
    assert series.buckets[0].start == minute - 59 * MINUTE
    assert series.buckets[-1].start == minute
    assert (series.buckets[-1].completed, series.buckets[-1].failed) == (5, 1)
    assert series.buckets[-1].retried == 1
    assert series.buckets[0].completed == 1
    assert series.buckets[-11].available == 10 and series.buckets[-11].completed == 1
    assert [bucket.available for bucket in series.buckets].count(None) == 59
    assert sum(bucket.completed for bucket in series.buckets[1:-11]) == 0
    assert series.totals["completed"] == 7
    one_queue = activity(HOUR, MINUTE, queue="other", now=NOW)
    assert one_queue.totals["completed"] == 1 and one_queue.buckets[-11].available == 6


def test_the_last_week_per_hour_reads_folded_and_minute_rows() -> None:
    hour = NOW.replace(minute=0, second=0)
    add_row(hour - 167 * HOUR, source="hour", completed=2, available=3)
    add_row(hour - 168 * HOUR, source="hour", completed=50)  # before the window
    add_row(hour + MINUTE, completed=1, available=None)
    add_row(hour + 2 * MINUTE, source="sampler", available=5)
    add_row(hour + 3 * MINUTE, source="sampler", available=8)
    series = activity(timedelta(days=7), HOUR, now=NOW)
    assert len(series.buckets) == 168
    assert series.buckets[0].start == hour - 167 * HOUR
    assert (series.buckets[0].completed, series.buckets[0].available) == (2, 3)
    assert (series.buckets[-1].completed, series.buckets[-1].available) == (1, 8)
    assert series.totals["completed"] == 3


def test_a_bucket_is_a_minute_or_an_hour() -> None:
    with pytest.raises(ValueError, match="a minute or an hour"):
        activity(HOUR, timedelta(minutes=5))
    with pytest.raises(ValueError, match="buckets"):
        activity(timedelta(days=30), MINUTE)


def test_recent_counts_per_queue() -> None:
    minute = NOW.replace(second=0)
    add_row(minute, completed=1, failed=2)
    add_row(minute - MINUTE, source="w2", completed=10)
    add_row(minute - 5 * MINUTE, completed=100, failed=20)
    add_row(minute - 15 * MINUTE, completed=1000)
    add_row(minute - 16 * MINUTE, completed=10000)
    add_row(minute, queue="quiet", source="sampler", available=3)
    counts = recent_counts(now=NOW)
    assert counts["default"].completed == {1: 11, 5: 111, 15: 1111}
    assert counts["default"].failed == {1: 2, 5: 22, 15: 22}
    assert counts["quiet"].completed == {1: 0, 5: 0, 15: 0}
