"""django_eddyq.testing, as a project's own tests use it: in a plain TestCase transaction (no
transaction=True, no worker process), with pytest fixtures and with unittest's TestCase."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import TestCase

from demo.models import Execution
from django_eddyq.models import Job
from django_eddyq.testing import (
    EddyqTestMixin,
    assert_enqueued,
    assert_not_enqueued,
    eager,
    enqueued,
    run_jobs,
)
from tests import jobs

# Not transaction=True: everything happens inside the test's transaction, rolled back after.
pytestmark = pytest.mark.django_db


def test_run_jobs_runs_the_due_jobs_in_the_tests_transaction() -> None:
    added = jobs.add.enqueue(2, 3)
    recorded = jobs.record.enqueue("in the test's transaction")
    later = jobs.add.using(run_at=timedelta(hours=1)).enqueue(1, 1)
    ran = run_jobs()
    assert [job.pk for job in ran] == [added.pk, recorded.pk]
    assert [(job.state, job.result) for job in ran] == [
        ("completed", 5),
        ("completed", "in the test's transaction"),
    ]
    assert Execution.objects.filter(label="in the test's transaction").exists()
    assert Job.objects.get(pk=later.pk).state == "scheduled"
    # Later on: a time in the future runs what is due by then.
    [ran_later] = run_jobs(now=Job.objects.get(pk=later.pk).run_at)
    assert (ran_later.pk, ran_later.result) == (later.pk, 2)


def test_retries_snoozes_and_discards_behave_as_documented() -> None:
    retried = jobs.always_fails.enqueue("again")
    snoozed = jobs.snooze.enqueue(60)
    discarded = jobs.discard.enqueue("no use")
    states = {job.pk: (job.state, job.attempt) for job in run_jobs()}
    assert states == {
        retried.pk: ("retryable", 1),
        snoozed.pk: ("scheduled", 0),
        discarded.pk: ("failed", 1),
    }
    assert run_jobs() == []  # nothing is due: the retry waits for its back-off


def test_a_handler_whose_query_fails_leaves_the_test_usable() -> None:
    broken = jobs.fails_inside_atomic.enqueue()
    after = jobs.add.enqueue(1, 2)
    ran = {job.pk: job for job in run_jobs()}
    assert ran[broken.pk].state == "failed"
    assert ran[after.pk].result == 3
    assert Job.objects.count() == 2  # the transaction still answers


def test_jobs_a_handler_enqueues_run_too(run_jobs: Callable[..., list[Job]]) -> None:
    # The pytest plugin's fixture, the same function.
    parent = jobs.enqueues_one_more.enqueue(3)
    ran = run_jobs()
    assert [job.task for job in ran] == [jobs.enqueues_one_more.path, jobs.add.path]
    assert ran[0].pk == parent.pk and ran[1].result == 4


def test_assertions_on_what_was_enqueued() -> None:
    jobs.send_email.enqueue("ada@example.com")
    jobs.add.using(priority=5, run_at=timedelta(minutes=10)).enqueue(1, b=2)
    [job] = assert_enqueued(jobs.send_email, ["ada@example.com"], queue="emails", priority=7)
    assert job.task == "tests.jobs.send_email"
    later = Job.objects.get(task=jobs.add.path).run_at
    assert_enqueued(jobs.add, [1], {"b": 2}, priority=5, run_at=later, count=1)
    assert len(enqueued()) == 2
    assert_not_enqueued(jobs.record)
    with pytest.raises(AssertionError, match=r"expected a job of tests.jobs.add with args=\[9\]"):
        assert_enqueued(jobs.add, [9])
    with pytest.raises(AssertionError, match=r"expected no job of tests\.jobs\.send_email"):
        assert_not_enqueued(jobs.send_email)


def test_eager_runs_a_job_as_its_transaction_commits(
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    with eager(), django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        job = jobs.add.enqueue(20, 22)
        assert Job.objects.get(pk=job.pk).state == "available"  # not before the commit
    assert Job.objects.get(pk=job.pk).result == 42


def test_the_eager_fixture(
    eddyq_eager: None, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = jobs.add.enqueue(1, 1)
    assert Job.objects.get(pk=job.pk).result == 2


class MixinTests(EddyqTestMixin, TestCase):
    def test_the_mixin(self) -> None:
        jobs.add.enqueue(4, 5)
        self.assertEnqueued(jobs.add, [4, 5])
        [ran] = self.run_jobs()
        assert ran.result == 9
        self.assertNotEnqueued(jobs.add)
