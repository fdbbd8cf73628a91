"""The admin's "Periodic schedules" page, through Django's test client: every configured
schedule (with or without a row), its next and last run and that run's job; run now, enable and
disable, each permission-checked and logged."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_eddyq.admin import format_datetime
from django_eddyq.maintenance.periodic import set_periodic_enabled
from django_eddyq.models import Job, PeriodicSchedule
from tests import jobs
from tests.factories import JobFactory
from tests.test_admin import messages_of, staff_client

pytestmark = pytest.mark.django_db

SCHEDULES = reverse("admin:django_eddyq_periodicschedule_changelist")
SCRIPT = "<script>alert('eddyq')</script>"
PERIODIC = {
    "hourly-report": {
        "task": jobs.record.path,
        "cron": "0 * * * *",
        "args": ["report"],
        "queue": "reports",
        "priority": 5,
    },
    "paris-digest": {
        "task": jobs.send_email.path,
        "cron": "0 8 * * 1-5",
        "timezone": "Europe/Paris",
        "args": ["team@example.com"],
    },
    SCRIPT: {"task": jobs.add.path, "cron": "*/5 * * * *", "args": [1, 2]},
}
configured = override_settings(EDDYQ={"PERIODIC": PERIODIC})


@pytest.fixture
def viewer() -> Client:
    return staff_client("view_periodicschedule", "view_job")


@pytest.fixture
def changer() -> Client:
    return staff_client("view_periodicschedule", "change_periodicschedule", "view_job")


def post(client: Client, action: str, schedule: str) -> Any:
    return client.post(SCHEDULES, {"action": action, "schedule": schedule})


def row_html(page: str, name: str) -> str:
    start = page.index(f'data-schedule="{name}"')
    return page[start : page.index("</tr>", start)]


def hour_start() -> Any:
    return timezone.now().replace(minute=0, second=0, microsecond=0)


@configured
def test_every_configured_schedule_is_listed_with_or_without_a_row(viewer: Client) -> None:
    last_run = hour_start()
    job = JobFactory(task=jobs.record.path)
    PeriodicSchedule.objects.create(name="hourly-report", last_run_at=last_run, last_job_id=job.pk)
    PeriodicSchedule.objects.create(name="retired", last_run_at=last_run)
    response = viewer.get(SCHEDULES)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Periodic schedules" in page
    report = row_html(page, "hourly-report")
    assert jobs.record.path in report and "0 * * * *" in report and "reports" in report
    assert format_datetime(last_run + timedelta(hours=1)) in report  # next run
    job_url = reverse("admin:django_eddyq_job_change", args=[job.pk])
    assert format_datetime(last_run) in report and f'href="{job_url}"' in report
    assert "icon-yes.svg" in report
    digest = row_html(page, "paris-digest")  # never run: no row yet
    assert "Europe/Paris" in digest and "emails" in digest
    assert "not configured" in row_html(page, "retired")
    # Buttons need the change permission.
    assert "run_schedule_now" not in page


@configured
def test_a_deleted_jobs_link_is_left_out(viewer: Client) -> None:
    job = JobFactory(task=jobs.record.path)
    PeriodicSchedule.objects.create(
        name="hourly-report", last_run_at=hour_start(), last_job_id=job.pk
    )
    Job.all_objects.filter(pk=job.pk).delete()
    report = row_html(viewer.get(SCHEDULES).content.decode(), "hourly-report")
    assert "/job/" not in report


@configured
def test_names_are_escaped(changer: Client) -> None:
    page = changer.get(SCHEDULES).content.decode()
    assert SCRIPT not in page
    assert "&lt;script&gt;" in page


@configured
def test_the_page_reads_a_few_queries_whatever_the_schedules(viewer: Client) -> None:
    for number in range(20):
        job = JobFactory()
        PeriodicSchedule.objects.create(
            name=f"old-{number}", last_run_at=timezone.now(), last_job_id=job.pk
        )
    viewer.get(SCHEDULES)  # the session, the user, the content types: cached after this
    with CaptureQueriesContext(connection) as queries:
        assert viewer.get(SCHEDULES).status_code == 200
    assert len(queries) <= 8, [query["sql"] for query in queries]


@configured
def test_disable_and_enable(changer: Client) -> None:
    response = post(changer, "disable_schedule", "paris-digest")
    assert response.status_code == 302
    assert PeriodicSchedule.objects.get(name="paris-digest").enabled is False
    assert "Disabled: paris-digest." in messages_of(changer.get(SCHEDULES))
    digest = row_html(changer.get(SCHEDULES).content.decode(), "paris-digest")
    assert "icon-no.svg" in digest and 'value="enable_schedule"' in digest

    post(changer, "disable_schedule", "paris-digest")  # already: no entry
    assert "paris-digest was already disabled." in messages_of(changer.get(SCHEDULES))
    post(changer, "enable_schedule", "paris-digest")
    assert PeriodicSchedule.objects.get(name="paris-digest").enabled is True
    entries = LogEntry.objects.filter(action_flag=CHANGE, object_id=quote("paris-digest"))
    assert sorted(entries.values_list("change_message", flat=True)) == ["Disabled", "Enabled"]


@configured
def test_run_now(changer: Client) -> None:
    set_periodic_enabled("hourly-report", False)
    before = PeriodicSchedule.objects.values().get(name="hourly-report")
    post(changer, "run_schedule_now", "hourly-report")
    job = Job.objects.get()
    assert (job.task, job.args, job.queue, job.priority) == (
        jobs.record.path,
        ["report"],
        "reports",
        5,
    )
    assert job.metadata == {"periodic": "hourly-report", "manual": True}
    assert PeriodicSchedule.objects.values().get(name="hourly-report") == before
    [message] = messages_of(changer.get(SCHEDULES))
    job_url = reverse("admin:django_eddyq_job_change", args=[job.pk])
    assert message == f'Enqueued <a href="{job_url}">job {job.pk}</a>: a run of hourly-report now.'
    entry = LogEntry.objects.get(action_flag=ADDITION)
    assert (entry.object_id, entry.get_change_message()) == (
        str(job.pk),
        "Enqueued by hand: a run of the schedule hourly-report",
    )


@configured
@pytest.mark.parametrize(
    ("action", "schedule", "message"),
    [
        ("run_schedule_now", "nope", "No periodic schedule 'nope' is configured"),
        ("disable_schedule", "retired", "No periodic schedule 'retired' is configured"),
        ("disable_schedule", "bad\x00name", "No periodic schedule"),
        ("delete_selected", "hourly-report", "no such action"),
        ("", "hourly-report", "no such action"),
    ],
)
def test_a_bad_post_changes_nothing(
    changer: Client, action: str, schedule: str, message: str
) -> None:
    PeriodicSchedule.objects.create(name="retired", last_run_at=timezone.now())
    assert post(changer, action, schedule).status_code == 302
    assert any(message in text for text in messages_of(changer.get(SCHEDULES)))
    assert not Job.all_objects.exists()
    assert list(PeriodicSchedule.objects.values_list("name", "enabled")) == [("retired", True)]
    assert not LogEntry.objects.exists()


@configured
def test_view_permission_cannot_steer(viewer: Client) -> None:
    for action in ("run_schedule_now", "disable_schedule", "enable_schedule"):
        assert post(viewer, action, "hourly-report").status_code == 403
    assert not Job.all_objects.exists() and not PeriodicSchedule.objects.exists()


@configured
def test_staff_without_the_permission_gets_403() -> None:
    client = staff_client("view_job", "change_job")
    assert client.get(SCHEDULES).status_code == 403
    assert post(client, "disable_schedule", "hourly-report").status_code == 403
    assert not PeriodicSchedule.objects.exists()


@configured
def test_a_schedules_page_shows_its_row(viewer: Client) -> None:
    job = JobFactory()
    PeriodicSchedule.objects.create(
        name="hourly-report", last_run_at=hour_start(), last_job_id=job.pk
    )
    url = reverse("admin:django_eddyq_periodicschedule_change", args=[quote("hourly-report")])
    page = viewer.get(url).content.decode()
    assert reverse("admin:django_eddyq_job_change", args=[job.pk]) in page
    Job.all_objects.all().delete()
    assert f"job {job.pk} (deleted)" in viewer.get(url).content.decode()
    assert viewer.post(url, {"enabled": "off"}).status_code == 403


def test_without_schedules_the_page_says_how_to_add_one(viewer: Client) -> None:
    page = viewer.get(SCHEDULES).content.decode()
    assert "No periodic schedules" in page
