"""The Django Tasks backend, used as a ``django.tasks`` user writes it; a burst worker runs jobs.

The tasks are in tests/django_tasks_jobs.py. The eddyq side (``Job``, ``Worker``) only shows up
to run jobs and to compare results with the rows they come from.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.db.models.functions import Now
from django.test import override_settings

from django_eddyq.backend import EddyqBackend, EddyqTask
from django_eddyq.limits import Limits
from django_eddyq.models import Job
from django_eddyq.registry import handler
from django_eddyq.worker import Worker
from django_eddyq.worker.passes import KeyedTasks, Pass, connect, run_pass
from tests import jobs as eddyq_jobs

try:
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskResultStatus, default_task_backend, task_backends
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]

TASKS = {
    "default": {
        "BACKEND": "django_eddyq.backend.EddyqBackend",
        "QUEUES": ["default", "emails"],
    }
}

with override_settings(TASKS=TASKS):
    from tests import django_tasks_jobs as jobs


@pytest.fixture(autouse=True)
def tasks_settings() -> Iterator[None]:
    with override_settings(TASKS=TASKS):
        yield


@pytest.fixture
def signals() -> Iterator[list[tuple[str, type, str, str]]]:
    received: list[tuple[str, type, str, str]] = []
    lock = threading.Lock()

    def receiver(name: str) -> Callable[..., None]:
        def receive(sender: type, task_result: Any, **kwargs: Any) -> None:
            with lock:
                received.append((name, sender, task_result.id, str(task_result.status)))

        return receive

    receivers = {
        task_enqueued: receiver("enqueued"),
        task_started: receiver("started"),
        task_finished: receiver("finished"),
    }
    for signal, receive in receivers.items():
        signal.connect(receive)
    yield received
    for signal, receive in receivers.items():
        signal.disconnect(receive)


def stored(result: Any) -> Job:
    return Job.objects.get(pk=int(result.id))


def make_task(**options: Any) -> EddyqTask:
    """An ``EddyqTask`` made directly (Django 6.0's ``Task`` has no defaults)."""
    fields = {"priority": 0, "backend": "default", "queue_name": "default", "run_after": None}
    return EddyqTask(**(fields | options))


def make_due(result: Any) -> None:
    """Skips a retry's backoff."""
    Job.objects.filter(pk=int(result.id)).update(run_at=Now())


# Settings and validation.


def test_the_backend_supports_everything() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, EddyqBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority


def test_tasks_are_made_by_the_backends_task_class() -> None:
    assert EddyqBackend.task_class is EddyqTask
    assert isinstance(jobs.add, EddyqTask)
    assert (jobs.add.max_attempts, jobs.add.timeout, jobs.add.retention) == (None, None, None)


def test_max_attempts_default_to_one() -> None:
    assert stored(jobs.add.enqueue(1, 2)).max_attempts == 1


def test_max_attempts_option() -> None:
    with override_settings(TASKS={"default": {**TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 4}}}):
        assert stored(jobs.add.enqueue(1, 2)).max_attempts == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"MAX_ATTEMPT": 3}, "unknown option 'MAX_ATTEMPT'. Did you mean 'MAX_ATTEMPTS'?"),
        ({"MAX_ATTEMPTS": 0}, "must be an integer ≥ 1, not 0"),
        ({"MAX_ATTEMPTS": "3"}, "must be an integer ≥ 1, not '3'"),
    ],
)
def test_invalid_options_are_refused(options: dict[str, Any], message: str) -> None:
    with (
        override_settings(TASKS={"default": {**TASKS["default"], "OPTIONS": options}}),
        pytest.raises(InvalidTaskBackend, match=message),
    ):
        task_backends["default"]


def test_queues_are_restricted_to_queues() -> None:
    with pytest.raises(InvalidTask, match="Queue 'reports' is not valid for backend"):
        jobs.add.using(queue_name="reports")
    with override_settings(TASKS={"default": {**TASKS["default"], "QUEUES": ["emails"]}}):
        with pytest.raises(InvalidTask, match="Queue 'default' is not valid"):
            jobs.add.enqueue(1, 2)
        assert jobs.send_email.enqueue("ada@example.com").status == TaskResultStatus.READY


def test_queue_names_follow_eddyqs_rules() -> None:
    with override_settings(TASKS={"default": {**TASKS["default"], "QUEUES": []}}):
        with pytest.raises(InvalidTask, match="queue name 'no spaces' is invalid"):
            jobs.add.using(queue_name="no spaces")
        assert stored(jobs.add.using(queue_name="anything").enqueue(1, 2)).queue == "anything"
    with (
        override_settings(TASKS={"default": {**TASKS["default"], "QUEUES": ["a b"]}}),
        pytest.raises(InvalidTaskBackend, match="queue name 'a b' is invalid"),
    ):
        task_backends["default"]


def test_run_after_is_validated() -> None:
    with pytest.raises(InvalidTask, match="aware"):
        jobs.add.using(run_after=datetime(2030, 1, 1))
    with pytest.raises(InvalidTask, match="must be from 0 to 36525 days"):
        jobs.add.using(run_after=timedelta(seconds=-1))


def test_priority_is_validated() -> None:
    with pytest.raises(InvalidTask, match="priority"):
        jobs.add.using(priority=101)


def test_djangos_own_checks_apply() -> None:
    def not_at_module_level() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        make_task(func=not_at_module_level)
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        make_task(func=jobs.add.func, takes_context=True)


def test_eddyq_options_are_validated() -> None:
    with pytest.raises(InvalidTask, match="max_attempts must be an integer"):
        make_task(func=jobs.add.func, max_attempts=0)
    with pytest.raises(InvalidTask, match="timeout"):
        make_task(func=jobs.add.func, timeout="soon")
    with pytest.raises(InvalidTask, match="retention key 'done'"):
        make_task(func=jobs.add.func, retention={"done": "1d"})


def test_limits_per_key_are_validated_and_give_each_job_its_key() -> None:
    with pytest.raises(InvalidTask, match="a key is given but no limit"):
        make_task(func=jobs.add.func, key=lambda a, **_: a)
    with pytest.raises(InvalidTask, match="rate 'often' is invalid"):
        make_task(func=jobs.add.func, rate="often")
    limited = make_task(func=jobs.add.func, concurrency=2, key=lambda b, **_: b * 10)
    assert limited.limits == Limits(concurrency=2)
    assert default_task_backend.job_spec(limited, (1, 2), {}).limit_key == "20"
    whole = make_task(func=jobs.add.func, rate="5/s")
    assert default_task_backend.job_spec(whole, (1, 2), {}).limit_key == ""
    context = make_task(
        func=jobs.describe_context.func, takes_context=True, concurrency=1, key=lambda label: label
    )
    assert default_task_backend.job_spec(context, ("x",), {}).limit_key == "x"


@pytest.mark.skipif(not jobs.FORWARDS_OPTIONS, reason="Django 6.0's @task takes no options")
def test_decorator_limits_per_key_hold_on_workers() -> None:
    results = [
        jobs.one_import_per_customer.enqueue(customer, part)
        for customer, part in (("acme", 1), ("acme", 2), ("globex", 3))
    ]
    assert [stored(result).limit_key for result in results] == ["acme", "acme", "globex"]
    keyed = KeyedTasks.declared()
    assert keyed is not None and jobs.one_import_per_customer.module_path in keyed.paths
    with connect() as conn:
        done = run_pass(
            conn,
            Pass(outcomes=[], renew=[], promote=False, claim=10, touch=[]),
            worker_id="w-1",
            lease_seconds=60,
            queues=None,
            keyed=keyed,
        )
    claimed = {job.id for job in done.claimed}
    assert claimed == {int(results[0].id), int(results[2].id)}  # one per customer


# Enqueueing.


def test_enqueue_stores_a_job_and_returns_its_result() -> None:
    result = jobs.echo.enqueue(1, (2, 3), key={"a": None})
    job = stored(result)
    assert result.id == str(job.pk)
    assert result.status == TaskResultStatus.READY
    assert result.backend == "default"
    assert result.task.func is jobs.echo.func
    assert (result.args, result.kwargs) == ([1, [2, 3]], {"key": {"a": None}})
    assert result.enqueued_at == job.created_at
    assert result.started_at is None and result.last_attempted_at is None
    assert result.finished_at is None
    assert result.errors == [] and result.worker_ids == [] and result.attempts == 0
    assert not result.is_finished
    # The job's task is the Django task's path, where a worker finds it again.
    assert job.task == jobs.echo.module_path == "tests.django_tasks_jobs.echo"
    assert (job.queue, job.priority, job.state) == ("default", 0, "available")
    assert job.metadata == {"django_tasks_backend": "default"}
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018


def test_queue_name_and_priority_are_the_jobs() -> None:
    job = stored(jobs.send_email.enqueue("ada@example.com"))
    assert (job.queue, job.priority) == ("emails", 7)
    job = stored(jobs.send_email.using(priority=-3, queue_name="default").enqueue("x"))
    assert (job.queue, job.priority) == ("default", -3)


def test_run_after_a_datetime_schedules_the_job() -> None:
    when = datetime(2100, 1, 1, tzinfo=UTC)
    result = jobs.add.using(run_after=when).enqueue(1, 2)
    job = stored(result)
    assert (job.state, job.run_at) == ("scheduled", when)
    assert result.status == TaskResultStatus.READY
    assert result.task.run_after == when


def test_run_after_a_timedelta_is_a_delay_from_the_enqueue() -> None:
    delayed = jobs.add.using(run_after=timedelta(hours=1))
    result = delayed.enqueue(1, 2)
    job = stored(result)
    assert job.state == "scheduled"
    assert job.run_at - job.created_at == timedelta(hours=1)  # both from the database's clock
    assert result.task.run_after == job.run_at
    # The task keeps its delay: each enqueue is an hour from its own time.
    assert delayed.run_after == timedelta(hours=1)


def test_using_sets_eddyqs_options() -> None:
    result = jobs.add.using(max_attempts=5, retention={"completed": "1h"}).enqueue(1, 2)
    job = stored(result)
    assert (job.max_attempts, job.retention) == (5, {"completed": 3600.0})


def test_enqueue_is_part_of_the_transaction() -> None:
    with contextlib.suppress(RuntimeError), transaction.atomic():
        result = jobs.add.enqueue(1, 2)
        raise RuntimeError("rolled back")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)


def test_a_django_task_joins_the_batch_it_is_enqueued_in() -> None:
    import django_eddyq

    with django_eddyq.batch() as batch:
        result = jobs.add.enqueue(1, 2)
    assert stored(result).batch_id == batch.pk


def test_arguments_must_be_json() -> None:
    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        jobs.echo.enqueue(object())
    assert not Job.objects.exists()


def test_aenqueue_and_aget_result() -> None:
    async def scenario() -> tuple[Any, Any]:
        result = await jobs.add.aenqueue(2, 3)
        return result, await jobs.add.aget_result(result.id)

    enqueued, fetched = async_to_sync(scenario)()
    assert enqueued.status == fetched.status == TaskResultStatus.READY
    assert fetched.id == enqueued.id and fetched.args == [2, 3]
    assert stored(fetched).task == jobs.add.module_path


# Running on eddyq workers.


def test_a_worker_runs_django_tasks(run_burst_worker: RunWorker) -> None:
    result = jobs.add.enqueue(2, 3)
    worker = run_burst_worker()
    assert result.status == TaskResultStatus.READY  # until refreshed
    result.refresh()
    job = stored(result)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 5 == job.result
    assert result.enqueued_at == job.created_at
    assert result.started_at == result.last_attempted_at == job.attempted_at
    assert result.finished_at == job.finalized_at is not None
    assert result.attempts == 1
    assert result.errors == []
    assert worker.processed == 1


def test_async_tasks_run_on_the_event_loop(run_burst_worker: RunWorker) -> None:
    result = jobs.async_add.enqueue(4, 5)
    run_burst_worker()
    fetched = jobs.async_add.get_result(result.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 9)


def test_a_task_that_takes_context_gets_its_result(run_burst_worker: RunWorker) -> None:
    sync_result = jobs.describe_context.enqueue("sync")
    async_result = jobs.async_describe_context.enqueue(label="async")
    worker = run_burst_worker()
    for result, label in ((sync_result, "sync"), (async_result, "async")):
        result.refresh()
        assert result.return_value == {
            "label": label,
            "attempt": 1,
            "id": result.id,
            "status": "RUNNING",
            "worker_ids": [worker.id],
            "errors": [],
            "enqueued": True,
            "backend": "default",
        }
        assert result.args == ([label] if label == "sync" else [])


def test_a_failure_is_a_task_error(run_burst_worker: RunWorker) -> None:
    result = jobs.fails.enqueue("boom")
    worker = run_burst_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback
    # A failed attempt of a Django task records its worker.
    assert result.worker_ids == [worker.id]
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018


def test_attempts_count_from_one_and_retries_keep_their_errors(
    run_burst_worker: RunWorker,
) -> None:
    result = jobs.fails_on_first_attempt.using(max_attempts=2).enqueue()
    first = run_burst_worker()
    result.refresh()
    assert result.status == TaskResultStatus.READY  # retryable
    assert result.attempts == 1 and result.worker_ids == [first.id]
    assert [error.exception_class_path for error in result.errors] == ["builtins.RuntimeError"]
    make_due(result)
    second = run_burst_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {
        "attempt": 2,
        "id": result.id,
        "status": "RUNNING",
        "worker_ids": [first.id, second.id],
        "errors": ["builtins.RuntimeError"],
        "enqueued": True,
        "backend": "default",
    }
    # Once finished, a job still names the worker of each attempt.
    assert result.worker_ids == [first.id, second.id]


def test_a_snoozed_attempt_does_not_count(
    run_burst_worker: RunWorker, signals: list[tuple[str, type, str, str]]
) -> None:
    result = jobs.snoozes.enqueue()
    run_burst_worker()
    result.refresh()
    assert (result.status, result.attempts, result.errors) == (TaskResultStatus.READY, 0, [])
    assert stored(result).state == "scheduled"
    assert signals[-1] == ("finished", EddyqBackend, result.id, "READY")


def test_the_status_follows_the_job_state() -> None:
    result = jobs.add.enqueue(1, 2)
    expected = {
        "scheduled": TaskResultStatus.READY,
        "available": TaskResultStatus.READY,
        "retryable": TaskResultStatus.READY,
        "running": TaskResultStatus.RUNNING,
        "completed": TaskResultStatus.SUCCESSFUL,
        "failed": TaskResultStatus.FAILED,
        "cancelled": TaskResultStatus.FAILED,
    }
    for state, status in expected.items():
        Job.objects.filter(pk=int(result.id)).update(state=state)
        result.refresh()
        assert result.status == status, state


def test_a_running_job_names_its_worker() -> None:
    result = jobs.add.enqueue(1, 2)
    Job.objects.filter(pk=int(result.id)).update(
        state="running", attempt=1, attempted_at=Now(), locked_by="host:1:abc"
    )
    result.refresh()
    assert (result.status, result.worker_ids) == (TaskResultStatus.RUNNING, ["host:1:abc"])
    assert result.started_at is not None


@pytest.mark.skipif(not jobs.FORWARDS_OPTIONS, reason="Django 6.0's @task takes no options")
def test_decorator_options_reach_the_task_class(run_burst_worker: RunWorker) -> None:
    assert (jobs.slow.max_attempts, jobs.slow.timeout) == (3, timedelta(milliseconds=200))
    result = jobs.slow.enqueue(5)
    job = stored(result)
    assert (job.max_attempts, job.retention) == (3, {"failed": None})
    run_burst_worker()
    result.refresh()
    assert result.status == TaskResultStatus.READY  # timed out, retryable
    assert [error.exception_class_path for error in result.errors] == ["builtins.TimeoutError"]


# Results.


def test_get_result_of_an_unknown_id() -> None:
    for result_id in ("1", "999999999", "abc", "", "-1", "01", "1.0", "9" * 30):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)("12345")


def test_get_result_of_an_expired_job(run_burst_worker: RunWorker) -> None:
    result = jobs.add.enqueue(1, 2)
    run_burst_worker()
    assert jobs.add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    with override_settings(EDDYQ={"RETENTION": {"completed": 0}}):
        with pytest.raises(TaskResultDoesNotExist):
            jobs.add.get_result(result.id)
        with pytest.raises(TaskResultDoesNotExist):
            result.refresh()
    # The row is still there, for the cleaner to delete.
    assert Job.all_objects.filter(pk=int(result.id)).exists()


def test_get_result_of_another_tasks_job() -> None:
    result = jobs.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        jobs.echo.get_result(result.id)


def test_get_result_shows_the_jobs_of_eddyqs_own_tasks(run_burst_worker: RunWorker) -> None:
    job = eddyq_jobs.send_email.enqueue("ada@example.com")
    run_burst_worker()
    result = default_task_backend.get_result(str(job.pk))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "ada@example.com"
    assert result.task.func is eddyq_jobs.send_email.func
    assert (result.task.queue_name, result.task.priority) == ("emails", 7)


def test_arefresh(run_burst_worker: RunWorker) -> None:
    result = jobs.add.enqueue(20, 22)
    run_burst_worker()
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


# Signals.


def test_signals_are_sent(
    run_burst_worker: RunWorker, signals: list[tuple[str, type, str, str]]
) -> None:
    succeeds = jobs.add.enqueue(1, 2)
    fails = jobs.fails.enqueue("no")
    runs_async = async_to_sync(jobs.async_add.aenqueue)(3, 4)
    backend = EddyqBackend
    assert signals == [
        ("enqueued", backend, succeeds.id, "READY"),
        ("enqueued", backend, fails.id, "READY"),
        ("enqueued", backend, runs_async.id, "READY"),
    ]
    signals.clear()
    run_burst_worker()
    assert sorted(signals) == sorted(
        [
            ("started", backend, succeeds.id, "RUNNING"),
            ("finished", backend, succeeds.id, "SUCCESSFUL"),
            ("started", backend, fails.id, "RUNNING"),
            ("finished", backend, fails.id, "FAILED"),
            ("started", backend, runs_async.id, "RUNNING"),
            ("finished", backend, runs_async.id, "SUCCESSFUL"),
        ]
    )


def test_a_failing_finished_receiver_changes_no_outcome(run_burst_worker: RunWorker) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver")

    task_finished.connect(broken)
    try:
        result = jobs.add.enqueue(1, 2)
        run_burst_worker()
    finally:
        task_finished.disconnect(broken)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_a_failing_started_receiver_fails_the_attempt(run_burst_worker: RunWorker) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver")

    task_started.connect(broken)
    try:
        result = jobs.add.enqueue(1, 2)
        run_burst_worker()
    finally:
        task_started.disconnect(broken)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == ["builtins.RuntimeError"]


def test_only_django_tasks_run_with_hooks() -> None:
    """eddyq's own tasks stay a bare call: no query, no signal, no context."""
    assert handler(eddyq_jobs.add.path).hooks is None
    assert handler(jobs.add.module_path).hooks is not None
