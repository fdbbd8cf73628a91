"""``Job.objects`` hides jobs past their retention deadline, with the cleaner's boundary.

Inside a test's transaction ``now()`` stands still, so the manager (which reads the database's
clock) and the cleaner (given that same time) judge each job at the same instant.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from django_eddyq.maintenance.cleaner import Cleaner
from django_eddyq.models import Batch, Job
from django_eddyq.selection import in_states
from tests.factories import BatchFactory, JobFactory

pytestmark = pytest.mark.django_db

MICROSECOND = timedelta(microseconds=1)
HOUR = timedelta(hours=1)
SETTINGS = {"RETENTION": {"completed": "1h", "failed": "7d", "cancelled": None, "batch": "7d"}}


@pytest.fixture(autouse=True)
def retention_settings() -> Any:
    with override_settings(EDDYQ=SETTINGS):
        yield


@pytest.fixture
def now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (value,) = cursor.fetchone()
    assert isinstance(value, datetime)
    return value


def make_job(
    now: datetime, state: str, age: timedelta | None, override: Any = None, **fields: Any
) -> Job:
    finalized_at = None if age is None else now - age
    job: Job = JobFactory(state=state, finalized_at=finalized_at, retention=override, **fields)
    return job


# (state, age since finalized_at, Job.retention, expired?) with RETENTION from SETTINGS.
CASES = {
    "completed at the deadline": ("completed", HOUR, None, True),
    "completed a microsecond before": ("completed", HOUR - MICROSECOND, None, False),
    "failed at the deadline": ("failed", timedelta(days=7), None, True),
    "failed a microsecond before": ("failed", timedelta(days=7) - MICROSECOND, None, False),
    "cancelled kept forever by default": ("cancelled", timedelta(days=36500), None, False),
    "override longer, past the default": ("completed", 2 * HOUR, {"completed": 7200.5}, False),
    "override longer, at its deadline": (
        "completed",
        timedelta(seconds=7200.5),
        {"completed": 7200.5},
        True,
    ),
    "override shorter, at its deadline": ("failed", HOUR, {"failed": 3600}, True),
    "override shorter, a microsecond before": (
        "failed",
        HOUR - MICROSECOND,
        {"failed": 3600},
        False,
    ),
    "override None beats the default": (
        "completed",
        timedelta(days=3650),
        {"completed": None},
        False,
    ),
    "override deletes what the default keeps": ("cancelled", HOUR, {"cancelled": 3600}, True),
    "override before the default keeps forever": (
        "cancelled",
        HOUR - MICROSECOND,
        {"cancelled": 3600},
        False,
    ),
    "override of zero": ("completed", timedelta(0), {"completed": 0}, True),
    "override for another state": ("completed", HOUR, {"failed": None}, True),
    "override not a number": ("completed", timedelta(days=3650), {"completed": "1h"}, False),
    "terminal without finalized_at": ("completed", None, {"completed": 0}, False),
    "available, however old": ("available", timedelta(days=3650), None, False),
    "scheduled, however old": ("scheduled", timedelta(days=3650), None, False),
    "running, however old": ("running", timedelta(days=3650), None, False),
    "retryable, however old": ("retryable", timedelta(days=3650), None, False),
}


@pytest.mark.parametrize(
    ("state", "age", "override", "expired"), list(CASES.values()), ids=list(CASES)
)
def test_invisible_exactly_when_the_cleaner_deletes(
    now: datetime, state: str, age: timedelta | None, override: Any, expired: bool
) -> None:
    job = make_job(now, state, age, override)
    invisible = not Job.objects.filter(pk=job.pk).exists()
    deleted = Cleaner().run_once(now=now) == 1
    assert invisible == expired
    assert deleted == expired
    assert Job.all_objects.filter(pk=job.pk).exists() != expired


def test_random_jobs_hidden_and_deleted_alike(now: datetime) -> None:
    """Many jobs around their deadlines: the hidden set is the deleted set."""
    rng = random.Random(20261122)
    overrides: list[Any] = [None, None, None, {"completed": 60}, {"failed": None}]
    overrides += [{"failed": 90.25, "cancelled": 30}, {"cancelled": None}, {"completed": 0}]
    for _ in range(300):
        state = rng.choice(["completed", "failed", "cancelled", "available", "running"])
        base = rng.choice([timedelta(0), timedelta(seconds=30), timedelta(seconds=60)])
        base = rng.choice([base, timedelta(seconds=90.25), HOUR, timedelta(days=7)])
        age = base + rng.choice([-MICROSECOND, timedelta(0), MICROSECOND])
        make_job(now, state, max(age, timedelta(0)), rng.choice(overrides))
    everything = set(Job.all_objects.values_list("id", flat=True))
    visible = set(Job.objects.values_list("id", flat=True))
    Cleaner().run_once(now=now)
    remaining = set(Job.all_objects.values_list("id", flat=True))
    assert everything - visible == everything - remaining
    assert visible == remaining
    assert 0 < len(remaining) < len(everything)


def test_all_objects_sees_everything(now: datetime) -> None:
    expired = make_job(now, "completed", 2 * HOUR)
    fresh = make_job(now, "completed", timedelta(minutes=1))
    assert list(Job.objects.all()) == [fresh]
    assert set(Job.all_objects.all()) == {expired, fresh}
    assert Job.objects.count() == 1
    assert Job.all_objects.count() == 2
    with pytest.raises(Job.DoesNotExist):
        Job.objects.get(pk=expired.pk)
    expired.refresh_from_db()  # the base manager is all_objects


def test_settings_are_read_when_the_query_runs(now: datetime) -> None:
    job = make_job(now, "completed", timedelta(minutes=30))
    queryset = Job.objects.filter(pk=job.pk)
    assert queryset.exists()
    with override_settings(EDDYQ={"RETENTION": {"completed": "30m"}}):
        assert not queryset.exists()
    assert Job.objects.filter(pk=job.pk).exists()


def test_joins_subqueries_and_related_managers(now: datetime) -> None:
    """Column references follow the query's aliases: no ambiguity with eddyq_batches' own
    state and finalized_at, and subqueries relabel them."""
    batch = BatchFactory(state="complete", finalized_at=now)
    expired = make_job(now, "completed", 2 * HOUR, batch=batch)
    fresh = make_job(now, "completed", timedelta(0), batch=batch)
    assert list(batch.jobs.all()) == [fresh]
    assert list(Job.objects.filter(batch__state="complete")) == [fresh]
    assert list(Batch.objects.filter(jobs__in=Job.objects.filter(pk=expired.pk))) == []
    assert list(Batch.objects.filter(jobs__in=Job.objects.all())) == [batch]
    assert Job.objects.filter(state="completed").update(priority=5) == 1
    expired.refresh_from_db()
    assert expired.priority == 0
    assert list(Job.objects.values_list("id", flat=True)) == [fresh.pk]


def plan(queryset: Any) -> str:
    """The plan with sequential scans off: which index the planner *can* use."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    try:
        text: str = queryset.explain()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = on")
    return text


@pytest.mark.parametrize(
    ("state", "indexes"),
    [
        ("available", ["claim_idx"]),
        # The task index holds these states too; the planner may take either.
        ("scheduled", ["eddyq_jobs_due_idx", "eddyq_jobs_task_idx"]),
        ("running", ["eddyq_jobs_lease_idx"]),
        ("failed", ["eddyq_jobs_finalized_idx", "eddyq_jobs_task_idx"]),
    ],
)
def test_queries_by_state_can_use_their_partial_indexes(state: str, indexes: list[str]) -> None:
    """The hiding condition must not stop a partial index's predicate from being proven. The
    available jobs are asked of their two indexes (``selection.in_states``): the claim's, of the
    jobs without a limit key, and the keyed claim's."""
    state_plan = plan(Job.objects.filter(in_states([state])).order_by())
    assert any(index in state_plan for index in indexes), state_plan
    if state == "available":
        assert "eddyq_jobs_keyed" in state_plan, state_plan
        assert "Seq Scan" not in state_plan, state_plan
