"""The cleaner: single passes with an injected ``now`` on the database's clock, no sleeping.

Inside a test's transaction ``now()`` stands still, so deadlines are set to the microsecond.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_eddyq.maintenance.cleaner import Cleaner
from django_eddyq.models import Batch, Job
from tests.factories import BatchFactory, JobFactory

pytestmark = pytest.mark.django_db

MICROSECOND = timedelta(microseconds=1)
NON_TERMINAL = ["scheduled", "available", "running", "retryable"]


def retention(**periods: Any) -> Any:
    """override_settings for RETENTION; the states not given keep their defaults."""
    return override_settings(EDDYQ={"RETENTION": periods})


@pytest.fixture
def now() -> datetime:
    """The database's clock, which stands still for the whole test."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (value,) = cursor.fetchone()
    assert isinstance(value, datetime)
    return value


def finished(state: str, finalized_at: datetime | None, **fields: Any) -> Job:
    job: Job = JobFactory(
        state=state, attempt=1, attempted_at=finalized_at, finalized_at=finalized_at, **fields
    )
    return job


def exists(job: Job) -> bool:
    return Job.all_objects.filter(pk=job.pk).exists()


@pytest.mark.parametrize("state", ["completed", "failed", "cancelled"])
def test_deadline_is_inclusive(now: datetime, state: str) -> None:
    with retention(**{state: "1h"}):
        at_deadline = finished(state, now - timedelta(hours=1))
        just_before = finished(state, now - timedelta(hours=1) + MICROSECOND)
        assert Cleaner().run_once(now=now) == 1
    assert not exists(at_deadline)
    assert exists(just_before)


def test_database_clock_by_default(now: datetime) -> None:
    at_deadline = finished("completed", now - timedelta(hours=24))
    just_before = finished("completed", now - timedelta(hours=24) + MICROSECOND)
    assert Cleaner().run_once() == 1
    assert not exists(at_deadline)
    assert exists(just_before)


def test_injected_now_decides(now: datetime) -> None:
    job = finished("completed", now)
    assert Cleaner().run_once(now=now + timedelta(hours=24) - MICROSECOND) == 0
    assert Cleaner().run_once(now=now + timedelta(hours=24)) == 1
    assert not exists(job)


def test_default_retentions(now: datetime) -> None:
    """24h for completed jobs, 7 days for failed and cancelled ones."""
    kept = [
        finished("completed", now - timedelta(hours=24) + MICROSECOND),
        finished("failed", now - timedelta(days=7) + MICROSECOND),
        finished("cancelled", now - timedelta(days=7) + MICROSECOND),
    ]
    finished("completed", now - timedelta(hours=24))
    finished("failed", now - timedelta(days=7))
    finished("cancelled", now - timedelta(days=7))
    assert Cleaner().run_once(now=now) == 3
    assert set(Job.all_objects.all()) == set(kept)


def test_zero_deletes_at_once(now: datetime) -> None:
    with retention(completed=0):
        job = finished("completed", now)
        assert Cleaner().run_once(now=now) == 1
    assert not exists(job)


def test_none_keeps_forever(now: datetime) -> None:
    with retention(failed=None):
        job = finished("failed", now - timedelta(days=365 * 200))
        assert Cleaner().run_once(now=now) == 0
    assert exists(job)


def test_longest_periods_keep_forever(now: datetime) -> None:
    """A period too long to subtract from now() neither fails nor deletes."""
    with retention(completed=timedelta(days=999_999_999)):
        job = finished("completed", now - timedelta(days=365 * 100))
        assert Cleaner().run_once(now=now) == 0
    assert exists(job)


def test_changed_setting_applies_to_jobs_already_finalized(now: datetime) -> None:
    job = finished("completed", now - timedelta(hours=2))
    assert Cleaner().run_once(now=now) == 0
    with retention(completed="2h"):
        assert Cleaner().run_once(now=now) == 1
    assert not exists(job)


@pytest.mark.parametrize("state", NON_TERMINAL)
def test_unfinished_jobs_are_never_deleted(now: datetime, state: str) -> None:
    ancient = now - timedelta(days=365 * 50)
    job = JobFactory(state=state, created_at=ancient, run_at=ancient, finalized_at=ancient)
    with override_settings(
        EDDYQ={"RETENTION": {"completed": 0, "failed": 0, "cancelled": 0, "batch": 0}}
    ):
        assert Cleaner().run_once(now=now) == 0
    assert exists(job)


def test_terminal_job_without_finalized_at_is_kept(now: datetime) -> None:
    job = finished("completed", None, retention={"completed": 0})
    with retention(completed=0):
        assert Cleaner().run_once(now=now) == 0
    assert exists(job)


# Per-job overrides.


def test_longer_override_beats_the_default(now: datetime) -> None:
    job = finished("completed", now - timedelta(hours=25), retention={"completed": 2 * 86400.0})
    assert Cleaner().run_once(now=now) == 0
    assert Cleaner().run_once(now=now + timedelta(hours=23) - MICROSECOND) == 0
    assert Cleaner().run_once(now=now + timedelta(hours=23)) == 1
    assert not exists(job)


def test_shorter_override_beats_the_default(now: datetime) -> None:
    at_deadline = finished("failed", now - timedelta(seconds=60), retention={"failed": 60.0})
    just_before = finished(
        "failed", now - timedelta(seconds=60) + MICROSECOND, retention={"failed": 60.0}
    )
    assert Cleaner().run_once(now=now) == 1
    assert not exists(at_deadline)
    assert exists(just_before)


def test_fractional_override(now: datetime) -> None:
    at_deadline = finished("completed", now - timedelta(seconds=1.5), retention={"completed": 1.5})
    just_before = finished(
        "completed", now - timedelta(seconds=1.5) + MICROSECOND, retention={"completed": 1.5}
    )
    assert Cleaner().run_once(now=now) == 1
    assert not exists(at_deadline)
    assert exists(just_before)


def test_override_of_none_keeps_forever_despite_the_default(now: datetime) -> None:
    job = finished("completed", now - timedelta(days=365 * 20), retention={"completed": None})
    with retention(completed=0):
        assert Cleaner().run_once(now=now) == 0
    assert exists(job)


def test_override_deletes_though_the_default_keeps_forever(now: datetime) -> None:
    with retention(cancelled=None):
        job = finished("cancelled", now - timedelta(hours=1), retention={"cancelled": 3600.0})
        kept = finished("cancelled", now - timedelta(days=365))
        assert Cleaner().run_once(now=now) == 1
    assert not exists(job)
    assert exists(kept)


def test_override_of_zero_deletes_at_once(now: datetime) -> None:
    job = finished("failed", now, retention={"failed": 0.0})
    assert Cleaner().run_once(now=now) == 1
    assert not exists(job)


def test_override_for_another_state_leaves_the_default(now: datetime) -> None:
    """An override names states; a job in a state it doesn't name goes by RETENTION."""
    job = finished("completed", now - timedelta(hours=24), retention={"failed": None})
    kept = finished("completed", now - timedelta(hours=23), retention={"failed": None})
    assert Cleaner().run_once(now=now) == 1
    assert not exists(job)
    assert exists(kept)


def test_override_that_is_not_a_number_keeps_forever(now: datetime) -> None:
    """Written by hand, say: the pass neither fails on it nor deletes the job."""
    job = finished("completed", now - timedelta(days=365), retention={"completed": "1h"})
    assert Cleaner().run_once(now=now) == 0
    assert exists(job)


# Batches of rows.


def test_deletes_in_bounded_batches(now: datetime, monkeypatch: pytest.MonkeyPatch) -> None:
    """More rows than a batch: all go, a statement per batch, each with a LIMIT. Rows that
    stay, interleaved with the doomed ones, don't stop the walk."""
    monkeypatch.setattr(Cleaner, "batch_size", 3)
    doomed = []
    kept = []
    for minutes in range(10):
        finalized_at = now - timedelta(days=2, minutes=minutes)
        doomed.append(finished("completed", finalized_at))
        kept.append(finished("completed", finalized_at, retention={"completed": None}))
    with CaptureQueriesContext(connection) as queries:
        assert Cleaner().run_once(now=now) == 10
    deletes = [q["sql"] for q in queries if 'DELETE FROM "eddyq_jobs"' in q["sql"]]
    # Completed jobs on the default: 3 + 3 + 3 + 1; then one short statement per other sweep.
    completed_default = [
        statement
        for statement in deletes
        if "'completed'" in statement and "finalized_at <=" in statement
    ]
    assert len(completed_default) == 4
    assert all("LIMIT 3" in statement for statement in deletes)
    assert not any(exists(job) for job in doomed)
    assert all(exists(job) for job in kept)


def test_batch_exactly_full_then_empty(now: datetime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Cleaner, "batch_size", 2)
    for _ in range(4):
        finished("failed", now - timedelta(days=8))
    assert Cleaner().run_once(now=now) == 4
    assert not Job.all_objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_row_locked_elsewhere_is_skipped_until_released() -> None:
    """SKIP LOCKED: a job another session holds is left for a later pass, which takes it."""
    from django_eddyq.db import connect

    long_ago = datetime.now(UTC) - timedelta(days=2)
    locked = finished("completed", long_ago)
    free = finished("completed", long_ago)
    with connect() as other, other.transaction():
        other.execute("SELECT 1 FROM eddyq_jobs WHERE id = %s FOR UPDATE", [locked.pk])
        assert Cleaner().run_once() == 1
        assert not exists(free)
        assert exists(locked)
    assert Cleaner().run_once() == 1
    assert not exists(locked)


# eddyq_batches.


def test_complete_batches_go_after_their_retention(now: datetime) -> None:
    at_deadline = BatchFactory(state="complete", finalized_at=now - timedelta(days=7))
    just_before = BatchFactory(state="complete", finalized_at=now - timedelta(days=7) + MICROSECOND)
    assert Cleaner().run_once(now=now) == 1
    assert not Batch.objects.filter(pk=at_deadline.pk).exists()
    assert Batch.objects.filter(pk=just_before.pk).exists()


def test_pending_batches_are_never_deleted(now: datetime) -> None:
    ancient = now - timedelta(days=365 * 10)
    pending = BatchFactory(state="pending", finalized_at=ancient, created_at=ancient)
    unfinalized = BatchFactory(state="pending", created_at=ancient)
    with retention(batch=0):
        assert Cleaner().run_once(now=now) == 0
    assert Batch.objects.filter(pk__in=[pending.pk, unfinalized.pk]).count() == 2


def test_batch_retention_of_none_keeps_them(now: datetime) -> None:
    batch = BatchFactory(state="complete", finalized_at=now - timedelta(days=365 * 10))
    with retention(batch=None):
        assert Cleaner().run_once(now=now) == 0
    assert Batch.objects.filter(pk=batch.pk).exists()


def test_jobs_of_a_reaped_batch_stay_unlinked(now: datetime) -> None:
    batch = BatchFactory(state="complete", finalized_at=now - timedelta(days=8))
    recent = finished("completed", now - timedelta(hours=1), batch=batch)
    retained = finished("failed", now - timedelta(days=30), batch=batch, retention={"failed": None})
    assert Cleaner().run_once(now=now) == 1
    assert not Batch.objects.filter(pk=batch.pk).exists()
    for job in (recent, retained):
        job.refresh_from_db()
        assert job.batch_id is None


def test_returns_jobs_and_batches_deleted_together(now: datetime) -> None:
    finished("completed", now - timedelta(days=1))
    finished("failed", now - timedelta(days=7), retention={"failed": 3600.0})
    finished("cancelled", now - timedelta(days=7))
    BatchFactory(state="complete", finalized_at=now - timedelta(days=7))
    assert Cleaner().run_once(now=now) == 4
    assert not Job.all_objects.exists()
    assert not Batch.objects.exists()


def test_service_shape() -> None:
    cleaner = Cleaner()
    assert (cleaner.name, cleaner.verb) == ("cleaner", "deleted")
    assert cleaner.interval() == 300.0
    with override_settings(EDDYQ={"CLEANER_INTERVAL": None}):
        assert cleaner.interval() is None


def test_the_job_table_is_vacuumed_after_a_small_share_of_dead_rows() -> None:
    """A migration gives eddyq_jobs its own autovacuum settings (docs/performance.md)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'eddyq_jobs'")
        (options,) = cursor.fetchone()
    assert "autovacuum_vacuum_scale_factor=0.01" in options
    assert "autovacuum_vacuum_threshold=1000" in options
