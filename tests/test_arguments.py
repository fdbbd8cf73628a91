"""Arguments of other types than JSON's: stored as tagged objects any reader can read, received by
the task as the values they were (tests/faults/test_bad_input.py checks this for every shape)."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings

from django_eddyq.models import Job
from django_eddyq.worker import Worker
from tests import jobs
from tests.codecs import Money
from tests.conftest import FAST_SETTINGS

pytestmark = pytest.mark.django_db(transaction=True)

RunWorker = Callable[..., Worker]
PARIS = ZoneInfo("Europe/Paris")


def enqueue_receiving(*args: object, **kwargs: object) -> int:
    job = jobs.receives.enqueue(0, *args, **kwargs)
    Job.objects.filter(pk=job.pk).update(args=[job.pk, *Job.objects.get(pk=job.pk).args[1:]])
    return job.pk


def test_the_task_receives_the_values_it_was_given(run_burst_worker: RunWorker) -> None:
    given = (
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        datetime.datetime(2030, 6, 1, 9, 15, tzinfo=PARIS),
        datetime.datetime(2030, 1, 1, 12, 0),
        datetime.date(2030, 1, 2),
        datetime.time(8, 30, 1, 500),
        Decimal("1.10"),
    )
    nested = {"when": [datetime.date(2031, 5, 6)], "$not_a_tag": {"$uuid": "just text"}}
    job_id = enqueue_receiving(*given, options=nested)
    stored = Job.objects.get(pk=job_id)
    # Readable by any JSON reader, in the admin too.
    assert stored.args[1:] == [
        {"$uuid": "12345678-1234-5678-1234-567812345678"},
        {"$datetime": "2030-06-01T09:15:00+02:00"},
        {"$datetime": "2030-01-01T12:00:00"},
        {"$date": "2030-01-02"},
        {"$time": "08:30:01.000500"},
        {"$decimal": "1.10"},
    ]
    run_burst_worker()
    args, kwargs = jobs.RECEIVED.pop(job_id)
    assert args == given
    assert [type(value) for value in args] == [type(value) for value in given]
    assert args[1].utcoffset() == datetime.timedelta(hours=2)  # the offset, kept
    assert str(args[5]) == "1.10"  # and the Decimal's exponent
    assert kwargs == {"options": nested}


def test_the_projects_own_types_go_through_its_codec(run_burst_worker: RunWorker) -> None:
    price = Money(Decimal("9.99"), "EUR")
    with override_settings(EDDYQ={**FAST_SETTINGS, "ARGUMENT_CODEC": "tests.codecs.codec"}):
        job_id = enqueue_receiving(price)
        assert Job.objects.get(pk=job_id).args[1] == {
            "$money": {"amount": "9.99", "currency": "EUR"}
        }
        run_burst_worker()
    assert jobs.RECEIVED.pop(job_id) == ((price,), {})


def test_without_the_codec_the_type_is_refused() -> None:
    with pytest.raises(TypeError, match="argument 0 is an object of type Money"):
        jobs.add.enqueue(Money(Decimal(1), "EUR"), 1)


def test_a_tagged_value_that_cannot_be_read_fails_its_job(run_burst_worker: RunWorker) -> None:
    job = jobs.echo.enqueue(1)
    Job.objects.filter(pk=job.pk).update(args=[{"$uuid": "not a uuid"}], max_attempts=1)
    run_burst_worker()
    stored = Job.objects.get(pk=job.pk)
    assert stored.state == "failed"
    assert "the stored args of job" in stored.errors[0]["error"]
    assert "$uuid 'not a uuid' cannot be read" in stored.errors[0]["error"]
