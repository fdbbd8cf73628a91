"""The queue cleaner: single passes with an injected ``now``, no sleeping."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings

from django_eddyq.maintenance.queue_cleaner import QueueCleaner
from django_eddyq.models import Queue
from tests.factories import JobFactory, QueueFactory

pytestmark = pytest.mark.django_db

MICROSECOND = timedelta(microseconds=1)
DAY = timedelta(hours=24)


@pytest.fixture
def now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (value,) = cursor.fetchone()
    assert isinstance(value, datetime)
    return value


def queue_names() -> set[str]:
    return set(Queue.objects.values_list("name", flat=True))


def test_deletes_idle_queues_not_updated_within_the_retention(now: datetime) -> None:
    QueueFactory(name="stale", updated_at=now - DAY)
    QueueFactory(name="recent", updated_at=now - DAY + MICROSECOND)
    assert QueueCleaner().run_once(now=now) == 1
    assert queue_names() == {"recent"}


def test_database_clock_by_default(now: datetime) -> None:
    QueueFactory(name="stale", updated_at=now - DAY)
    QueueFactory(name="recent", updated_at=now - DAY + MICROSECOND)
    assert QueueCleaner().run_once() == 1
    assert queue_names() == {"recent"}


def test_keeps_paused_queues_however_stale(now: datetime) -> None:
    """Deleting a paused queue's row would silently resume it."""
    long_ago = now - timedelta(days=365)
    QueueFactory(name="paused", updated_at=long_ago, paused_at=long_ago)
    assert QueueCleaner().run_once(now=now) == 0
    assert queue_names() == {"paused"}


@pytest.mark.parametrize("state", ["scheduled", "available", "running", "retryable"])
def test_keeps_queues_with_unfinished_jobs(now: datetime, state: str) -> None:
    QueueFactory(name="busy", updated_at=now - timedelta(days=30))
    JobFactory(queue="busy", state=state)
    JobFactory(queue="other", state=state)
    assert QueueCleaner().run_once(now=now) == 0
    assert queue_names() == {"busy"}


def test_finished_jobs_dont_keep_a_queue(now: datetime) -> None:
    QueueFactory(name="done", updated_at=now - timedelta(days=30))
    for state in ("completed", "failed", "cancelled"):
        JobFactory(queue="done", state=state, finalized_at=now)
    assert QueueCleaner().run_once(now=now) == 1
    assert queue_names() == set()


def test_setting_decides_and_zero_deletes_every_idle_queue(now: datetime) -> None:
    QueueFactory(name="hour-old", updated_at=now - timedelta(hours=1))
    QueueFactory(name="just-now", updated_at=now)
    QueueFactory(name="paused", updated_at=now, paused_at=now)
    with override_settings(EDDYQ={"QUEUE_RETENTION": "2h"}):
        assert QueueCleaner().run_once(now=now) == 0
    with override_settings(EDDYQ={"QUEUE_RETENTION": "1h"}):
        assert QueueCleaner().run_once(now=now) == 1
    with override_settings(EDDYQ={"QUEUE_RETENTION": 0}):
        assert QueueCleaner().run_once(now=now) == 1
    assert queue_names() == {"paused"}


def test_counts_every_queue_deleted(now: datetime) -> None:
    for number in range(5):
        QueueFactory(name=f"old-{number}", updated_at=now - timedelta(days=2))
    assert QueueCleaner().run_once(now=now) == 5
    assert QueueCleaner().run_once(now=now) == 0


def test_service_shape() -> None:
    cleaner = QueueCleaner()
    assert cleaner.interval() == 3600.0
    assert cleaner.verb == "deleted"
    with override_settings(EDDYQ={"QUEUE_CLEANER_INTERVAL": None}):
        assert cleaner.interval() is None
