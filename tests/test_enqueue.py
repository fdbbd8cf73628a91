from __future__ import annotations

import datetime as dt
import decimal
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_eddyq import Call, task
from django_eddyq.db import connection_params
from django_eddyq.models import Job, Queue
from django_eddyq.sql import JOBS_CHANNEL
from tests import jobs

pytestmark = pytest.mark.django_db


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        value: dt.datetime = cursor.fetchone()[0]
    return value


def test_enqueue_stores_an_available_job() -> None:
    job = jobs.add.enqueue(1, b=2)

    stored = Job.objects.get(pk=job.pk)
    assert stored.task == "tests.jobs.add"
    assert stored.args == [1]
    assert stored.kwargs == {"b": 2}
    assert stored.state == Job.State.AVAILABLE == job.state
    assert stored.queue == "default"
    assert stored.priority == 0
    assert stored.attempt == 0
    assert stored.max_attempts == 25
    assert stored.errors == []
    assert stored.run_at == job.run_at
    assert stored.created_at == job.created_at
    assert job.run_at <= db_now()


def test_task_options_are_stored() -> None:
    job = jobs.send_email.enqueue("a@example.com")
    stored = Job.objects.get(pk=job.pk)
    assert (stored.queue, stored.priority, stored.max_attempts) == ("emails", 7, 4)


def test_using_overrides_options_without_changing_the_task() -> None:
    when = timezone.now() + timedelta(hours=1)
    job = jobs.send_email.using(queue="bulk", priority=-5, run_at=when, max_attempts=2).enqueue(
        "b@example.com"
    )
    stored = Job.objects.get(pk=job.pk)
    assert (stored.queue, stored.priority, stored.max_attempts) == ("bulk", -5, 2)
    assert stored.state == Job.State.SCHEDULED
    assert stored.run_at == when
    assert jobs.send_email.queue == "emails"


def test_a_delay_is_added_to_the_database_clock() -> None:
    before = db_now()
    job = jobs.add.using(run_at=timedelta(minutes=5)).enqueue(1, 2)
    assert job.state == Job.State.SCHEDULED
    assert timedelta(minutes=5) <= job.run_at - before < timedelta(minutes=5, seconds=5)


def test_run_at_in_the_past_is_available() -> None:
    job = jobs.add.using(run_at=timezone.now() - timedelta(days=1)).enqueue(1, 2)
    assert job.state == Job.State.AVAILABLE


def test_naive_run_at_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        jobs.add.using(run_at=dt.datetime(2030, 1, 1))


def test_defaults_resolve_at_enqueue_not_at_decoration() -> None:
    @task
    def undecided() -> None: ...

    with override_settings(EDDYQ={"DEFAULT_QUEUE": "later", "MAX_ATTEMPTS": 3}):
        job = undecided.enqueue()
    assert (job.queue, job.max_attempts) == ("later", 3)
    assert undecided.enqueue().queue == "default"


def test_tuples_become_lists_and_values_round_trip() -> None:
    value = {"nested": (1, (2, 3)), "text": "é\u2603", "float": 0.5, "none": None, "bool": True}
    job = jobs.echo.enqueue((1, 2), value)
    stored = Job.objects.get(pk=job.pk)
    expected = [[1, 2], {**value, "nested": [1, [2, 3]]}]
    assert stored.args == expected == job.args


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((object(),), {}, r"argument 0 is an object of type object"),
        (
            (1, {"every": dt.timedelta(days=1)}),
            {},
            r"argument 1\['every'\] is an object of type timedelta",
        ),
        ((), {"amount": decimal.Decimal("NaN")}, r"argument 'amount' is the Decimal NaN"),
        ((), {"data": [1, [2, {3}]]}, r"argument 'data'\[1\]\[1\] is an object of type set"),
        ((), {"data": {1: "x"}}, r"argument 'data' is a dict key of type int"),
        ((float("nan"),), {}, r"argument 0 is the float nan"),
        (("a\x00b",), {}, r"argument 0 is a string containing NUL"),
    ],
)
def test_non_json_arguments_raise_type_error_naming_where(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    jobs.add.enqueue(1, 2)
    with pytest.raises(TypeError, match=message):
        jobs.echo.enqueue(*args, **kwargs)
    assert Job.objects.count() == 1


def test_enqueue_many_mixes_positional_keyword_and_both() -> None:
    created = jobs.echo.enqueue_many([(1,), {"user_id": 3}, Call(2, lang="fr"), [4, 5]])
    assert [(job.args, job.kwargs) for job in created] == [
        ([1], {}),
        ([], {"user_id": 3}),
        ([2], {"lang": "fr"}),
        ([4, 5], {}),
    ]
    ids = [job.pk for job in created]
    assert ids == sorted(ids)
    stored = {job.pk: (job.args, job.kwargs) for job in Job.objects.filter(pk__in=ids)}
    assert [stored[pk] for pk in ids] == [(job.args, job.kwargs) for job in created]


def test_enqueue_many_inserts_nothing_when_one_item_is_invalid() -> None:
    with pytest.raises(TypeError, match=r"argument 'every' is an object of type timedelta"):
        jobs.echo.enqueue_many([(1,), {"every": dt.timedelta(hours=1)}, (3,)])
    assert not Job.objects.exists()


def test_enqueue_many_rejects_items_of_other_types() -> None:
    with pytest.raises(TypeError, match="enqueue_many item 1 must be a tuple"):
        jobs.echo.enqueue_many([(1,), "oops"])
    assert not Job.objects.exists()


def test_enqueue_many_of_nothing_is_nothing() -> None:
    assert jobs.echo.enqueue_many([]) == []


@pytest.mark.parametrize("priority", [-101, 101, 1.5, True, "1"])
def test_priority_out_of_range_raises_value_error(priority: object) -> None:
    with pytest.raises(ValueError, match="priority must be an integer from -100 to 100"):
        jobs.add.using(priority=priority)  # type: ignore[arg-type]


@pytest.mark.parametrize("priority", [-100, 100])
def test_priority_limits_are_allowed(priority: int) -> None:
    assert jobs.add.using(priority=priority).enqueue(1, 2).priority == priority


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "semi;colon", "ünïcode", "q'"])
def test_bad_queue_names_raise_value_error(name: str) -> None:
    with pytest.raises(ValueError, match="queue name"):
        jobs.add.using(queue=name)


@pytest.mark.parametrize("name", ["a", "a" * 64, "emails.high:v2-b_c"])
def test_good_queue_names(name: str) -> None:
    assert jobs.add.using(queue=name).enqueue(1, 2).queue == name


def test_retention_override_is_stored_in_seconds() -> None:
    job = jobs.add.using(retention={"completed": "30d", "failed": None}).enqueue(1, 2)
    assert Job.objects.get(pk=job.pk).retention == {"completed": 30 * 86400.0, "failed": None}


def test_retention_override_rejects_unknown_states() -> None:
    with pytest.raises(ValueError, match="retention key 'running'"):
        jobs.add.using(retention={"running": "1h"})


def test_calling_a_task_runs_it_here() -> None:
    assert jobs.add(2, 3) == 5
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_rolled_back_enqueue_leaves_nothing_and_notifies_nobody() -> None:
    with psycopg.connect(**connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {JOBS_CHANNEL}")

        def enqueue_then_fail() -> None:
            with transaction.atomic():
                jobs.add.enqueue(1, 2)
                raise RuntimeError("roll back")

        with pytest.raises(RuntimeError):
            enqueue_then_fail()

        assert not Job.objects.exists()
        assert list(listener.notifies(timeout=0.3)) == []


@pytest.mark.django_db(transaction=True)
def test_committed_enqueue_notifies_its_queue_once_on_commit() -> None:
    with psycopg.connect(**connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {JOBS_CHANNEL}")

        with transaction.atomic():
            jobs.add.enqueue(1, 2)
            jobs.send_email.enqueue("x@example.com")
            jobs.add.enqueue(3, 4)
            assert list(listener.notifies(timeout=0.2)) == []  # not before commit

        payloads = sorted(n.payload for n in listener.notifies(timeout=0.5, stop_after=2))
        assert payloads == ["default", "emails"]


@pytest.mark.django_db(transaction=True)
def test_scheduled_jobs_do_not_wake_workers() -> None:
    with psycopg.connect(**connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {JOBS_CHANNEL}")
        jobs.add.using(run_at=timedelta(hours=1)).enqueue(1, 2)
        assert list(listener.notifies(timeout=0.3)) == []


@override_settings(EDDYQ={"DEFAULT_QUEUE": "bad name"})
def test_invalid_default_queue_setting_is_refused_at_enqueue() -> None:
    with pytest.raises(Exception, match="DEFAULT_QUEUE"):
        jobs.add.enqueue(1, 2)


def test_the_returned_job_has_every_field_as_stored() -> None:
    job = jobs.add.using(retention={"failed": "1d"}, priority=3).enqueue(1, b=2)
    stored = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(job, field.attname) == getattr(stored, field.attname), field.attname
    assert job._state.db == stored._state.db
    assert not job._state.adding
    job.refresh_from_db()
    job.save(update_fields=["metadata"])


@pytest.mark.django_db(transaction=True)
def test_a_large_enqueue_many_streams_with_copy_and_matches_the_insert() -> None:
    from django_eddyq.enqueue import COPY_THRESHOLD

    calls = [(n, n) for n in range(COPY_THRESHOLD)] + [
        Call(1, b=2),
    ]
    with psycopg.connect(**connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {JOBS_CHANNEL}")
        created = jobs.add.using(queue="bulk", priority=4).enqueue_many(calls)
        later = jobs.add.using(run_at=timedelta(hours=1)).enqueue_many([(1, 1)] * COPY_THRESHOLD)
        assert [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)] == ["bulk"]
    assert len(created) == COPY_THRESHOLD + 1
    ids = [job.pk for job in created]
    assert ids == sorted(ids)
    stored = {job.pk: job for job in Job.objects.filter(pk__in=ids)}
    for job in (created[0], created[-1]):
        for field in Job._meta.concrete_fields:
            assert getattr(job, field.attname) == getattr(stored[job.pk], field.attname)
    assert stored[created[-1].pk].kwargs == {"b": 2}
    assert {job.state for job in later} == {"scheduled"}
    assert Queue.objects.filter(name="bulk").exists()


@pytest.mark.django_db(transaction=True)
def test_a_large_enqueue_many_stores_the_times_of_its_transaction_or_those_given() -> None:
    from django_eddyq.enqueue import COPY_THRESHOLD

    past = timezone.now() - timedelta(minutes=5)
    with transaction.atomic():
        with connection.cursor() as cursor:
            # The transaction's start: later statements' own times differ from it.
            cursor.execute("SELECT now()")
            started = cursor.fetchone()[0]
        due_now = jobs.add.enqueue_many([(1, 1)] * COPY_THRESHOLD)
        overdue = jobs.add.using(run_at=past).enqueue_many([(2, 2)] * COPY_THRESHOLD)
    for created in (due_now, overdue):
        stored = {job.pk: job for job in Job.objects.filter(pk__in=[job.pk for job in created])}
        for job in (created[0], created[-1]):
            assert job.created_at == stored[job.pk].created_at == started
            assert job.run_at == stored[job.pk].run_at
    assert {job.run_at for job in due_now} == {started}
    assert {(job.state, job.run_at) for job in overdue} == {("available", past)}
    assert set(Job.objects.filter(pk__in=[job.pk for job in overdue]).values_list("run_at")) == {
        (past,)
    }


@pytest.mark.django_db(transaction=True)
def test_a_large_enqueue_many_in_a_batch_with_retention_matches_what_is_stored() -> None:
    import django_eddyq
    from django_eddyq.enqueue import COPY_THRESHOLD

    task_with_retention = jobs.add.using(retention={"failed": "1d"}, max_attempts=3)
    with django_eddyq.batch() as batch:
        created = task_with_retention.enqueue_many([(n, 1) for n in range(COPY_THRESHOLD)])
    stored = {job.pk: job for job in Job.objects.filter(batch=batch)}
    assert len(stored) == COPY_THRESHOLD
    for job in created:
        for field in Job._meta.concrete_fields:
            assert getattr(job, field.attname) == getattr(stored[job.pk], field.attname)
    # Each job's mutable values are its own.
    first, second = created[:2]
    assert first.retention is not second.retention
    assert first.metadata is not second.metadata
    assert first.errors is not second.errors
    assert first.args == [0, 1] and second.args == [1, 1]


@pytest.mark.django_db(transaction=True)
def test_a_large_enqueue_many_rolls_back_with_its_transaction() -> None:
    from django_eddyq.enqueue import COPY_THRESHOLD

    def enqueue_then_fail() -> None:
        with transaction.atomic():
            jobs.add.enqueue_many([(1, 2)] * COPY_THRESHOLD)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert not Job.all_objects.exists()


def prepared_inserts() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements"
            " WHERE statement LIKE '%%INSERT INTO eddyq_jobs%%'"
        )
        (count,) = cursor.fetchone()
    return int(count)


@pytest.mark.django_db(transaction=True)
def test_enqueue_prepares_its_insert_and_leaves_djangos_connection_as_configured() -> None:
    connection.close()  # a connection of this test's own, with no statement prepared yet
    for _ in range(7):
        jobs.add.enqueue(1, 2)
    assert prepared_inserts() == 1
    assert connection.connection.prepare_threshold is None


@pytest.mark.django_db(transaction=True)
def test_enqueue_prepares_nothing_behind_a_transaction_pooler() -> None:
    connection.close()
    with override_settings(EDDYQ={"LISTEN_NOTIFY": False}):
        for _ in range(7):
            jobs.add.enqueue(1, 2)
    assert prepared_inserts() == 0
