"""A queue's limits in the admin: shown in the queue list, set on the queue's page by a user who
may change queues, through ``operations.set_queue_limits``, with the form saying what is wrong
and nothing changed when a value is not a limit."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_eddyq import set_queue_limits
from django_eddyq.models import Queue
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db

QUEUES = reverse("admin:django_eddyq_queue_changelist")
NO_LIMITS = {"concurrency": "", "rate": "", "burst": ""}


def queue_url(name: str) -> str:
    return reverse("admin:django_eddyq_queue_change", args=[quote(name)])


def staff_client(*codenames: str) -> Client:
    user = User.objects.create_user(f"staff-{'-'.join(codenames)}", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_eddyq", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer() -> Client:
    return staff_client("view_queue")


@pytest.fixture
def changer() -> Client:
    return staff_client("view_queue", "change_queue")


def limits_of(name: str) -> tuple[Any, ...]:
    return tuple(
        Queue.objects.values_list("concurrency", "rate_limit", "rate_period", "rate_burst").get(
            name=name
        )
    )


def limits_column(client: Client) -> dict[str, str]:
    response = client.get(QUEUES)
    admin = response.context["cl"].model_admin
    return {queue.name: admin.limits_display(queue) for queue in response.context["cl"].result_list}


def test_the_list_shows_each_queues_limits(viewer: Client) -> None:
    QueueFactory(name="free")
    set_queue_limits("both", concurrency=5, rate="100/m")
    set_queue_limits("running", concurrency=1)
    set_queue_limits("started", rate="2/10s", burst=2)
    assert limits_column(viewer) == {
        "both": "≤ 5 running · 100/m (burst 2)",
        "free": "—",
        "running": "≤ 1 running",
        "started": "2/10s (burst 2)",
    }
    html = viewer.get(QUEUES).content.decode()
    assert '<td class="field-limits_display">≤ 5 running · 100/m (burst 2)</td>' in html


def test_the_form_shows_the_limits_as_written(changer: Client) -> None:
    set_queue_limits("emails", concurrency=5, rate="100/m")
    set_queue_limits("reports", rate="10/s", burst=3)
    form = changer.get(queue_url("emails")).context["adminform"].form
    assert {name: form[name].value() for name in NO_LIMITS} == {
        "concurrency": 5,
        "rate": "100/m",
        "burst": None,  # the default: it follows the rate when the rate changes
    }
    form = changer.get(queue_url("reports")).context["adminform"].form
    assert {name: form[name].value() for name in NO_LIMITS} == {
        "concurrency": None,
        "rate": "10/s",
        "burst": 3,
    }


def test_saving_the_form_sets_the_limits(changer: Client) -> None:
    QueueFactory(name="emails", paused_at=timezone.now())
    page = changer.get(queue_url("emails")).content.decode()
    assert 'name="_save"' in page
    assert 'name="concurrency"' in page

    response = changer.post(
        queue_url("emails"),
        {"concurrency": "2", "rate": " 10/s ", "burst": "", "_save": "Save"},
    )
    assert response.status_code == 302
    assert response["Location"] == QUEUES
    assert limits_of("emails") == (2, 10, 1.0, 10)
    assert Queue.objects.get(name="emails").is_paused  # nothing else changed
    entry = LogEntry.objects.get()
    assert (entry.action_flag, entry.object_id) == (CHANGE, "emails")
    assert entry.get_change_message() == "Changed Concurrency and Rate."
    assert limits_column(changer)["emails"] == "≤ 2 running · 10/s (burst 10)"


def test_the_form_changes_no_other_field(changer: Client) -> None:
    QueueFactory(name="emails")
    response = changer.post(
        queue_url("emails"),
        {**NO_LIMITS, "name": "other", "paused_at": "2020-01-01 00:00", "metadata": '{"a": 1}'},
    )
    assert response.status_code == 302
    queue = Queue.objects.get()
    assert (queue.name, queue.paused_at, queue.metadata) == ("emails", None, {})


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"concurrency": "0"}, "concurrency", "Concurrency must be an integer ≥ 1, not 0."),
        ({"concurrency": "many"}, "concurrency", "Enter a whole number."),
        ({"concurrency": str(2**31)}, "concurrency", f"Concurrency {2**31} is more than"),
        ({"rate": "fast"}, "rate", "Rate 'fast' is invalid: write N/PERIOD"),
        ({"rate": "0/s"}, "rate", "give 1 or more jobs"),
        ({"rate": "5/s\x00"}, "rate", "Null characters are not allowed."),
        ({"rate": "2/s", "burst": "3"}, "burst", "Burst 3 is more than the rate's 2 jobs"),
        ({"rate": "2/s", "burst": "0"}, "burst", "Burst must be an integer ≥ 1, not 0."),
        ({"burst": "3"}, "burst", "Burst is given without a rate."),
    ],
)
def test_a_bad_value_is_the_fields_error_and_changes_nothing(
    changer: Client, data: dict[str, str], field: str, message: str
) -> None:
    set_queue_limits("emails", concurrency=4, rate="1/s")
    before = limits_of("emails")
    response = changer.post(queue_url("emails"), {**NO_LIMITS, **data, "_save": "Save"})
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert list(form.errors) == [field]
    assert message in form.errors[field][0]
    assert limits_of("emails") == before
    assert not LogEntry.objects.exists()


def test_lifting_the_limits(changer: Client) -> None:
    set_queue_limits("emails", concurrency=4, rate="100/m", burst=5)
    response = changer.post(queue_url("emails"), {**NO_LIMITS, "_save": "Save"})
    assert response.status_code == 302
    assert limits_of("emails") == (None, None, None, None)
    assert limits_column(changer)["emails"] == "—"
    assert LogEntry.objects.get().action_flag == CHANGE


def test_the_burst_left_empty_follows_a_new_rate(changer: Client) -> None:
    set_queue_limits("emails", rate="100/m")  # burst 2, the default
    form = changer.get(queue_url("emails")).context["adminform"].form
    data = {name: form[name].value() or "" for name in NO_LIMITS}
    changer.post(queue_url("emails"), {**data, "rate": "10/s"})
    assert limits_of("emails") == (None, 10, 1.0, 10)


def test_without_the_change_permission_limits_are_read_only(viewer: Client) -> None:
    set_queue_limits("emails", concurrency=4, rate="100/m")
    page = viewer.get(queue_url("emails")).content.decode()
    assert "≤ 4 running · 100/m (burst 2)" in page
    assert 'name="concurrency"' not in page
    assert 'name="_save"' not in page
    response = viewer.post(queue_url("emails"), {**NO_LIMITS, "_save": "Save"})
    assert response.status_code == 403
    assert limits_of("emails") == (4, 100, 60.0, 2)
    assert not LogEntry.objects.exists()
