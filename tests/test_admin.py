"""The admin, through Django's test client: permissions, filters, actions, escaping, query counts.

The admin must stay fast at a million jobs; here that shows as query counts that do not grow
with the rows, counts that stop at a limit and become estimates, and filters whose choices come
from bounded queries. ``benchmarks/admin_changelist.py`` times the real thing.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.db.models.functions import Now
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_eddyq import inspection, retention, sql
from django_eddyq.admin import format_datetime
from django_eddyq.election import ELECTION
from django_eddyq.maintenance.cleaner import Cleaner
from django_eddyq.models import Batch, Job, Leader, Queue, WorkerProcess
from tests import jobs
from tests.factories import BatchFactory, JobFactory, QueueFactory

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_eddyq_job_changelist")
BATCHES = reverse("admin:django_eddyq_batch_changelist")
QUEUES = reverse("admin:django_eddyq_queue_changelist")
WORKERS = reverse("admin:django_eddyq_workerprocess_changelist")
MICROSECOND = timedelta(microseconds=1)


def job_url(job: Job) -> str:
    return reverse("admin:django_eddyq_job_change", args=[job.pk])


def staff_client(*codenames: str) -> Client:
    user = User.objects.create_user(f"staff-{len(codenames)}-{'-'.join(codenames)}", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_eddyq", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer() -> Client:
    return staff_client("view_job", "view_batch", "view_queue")


@pytest.fixture
def changer() -> Client:
    return staff_client("view_job", "change_job", "view_queue", "change_queue")


@pytest.fixture
def deleter() -> Client:
    return staff_client("view_job", "delete_job")


@pytest.fixture
def superuser(admin_client: Client) -> Client:
    return admin_client


def failed_job(**fields: Any) -> Job:
    job: Job = JobFactory(failed=True, **fields)
    return job


def action(client: Client, name: str, jobs: list[Any], url: str = JOBS, **extra: str) -> Any:
    data = {"action": name, "index": "0", "_selected_action": [str(j.pk) for j in jobs], **extra}
    return client.post(url, data)


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]] if response.context else []


def ids_listed(response: Any) -> list[int]:
    return [job.pk for job in response.context["cl"].result_list]


# Permissions.


def test_staff_without_permissions_gets_403() -> None:
    client = staff_client()
    job = failed_job()
    for url in (JOBS, job_url(job), BATCHES, QUEUES, WORKERS):
        assert client.get(url).status_code == 403
    assert action(client, "retry_jobs", [job]).status_code == 403
    job.refresh_from_db()
    assert job.state == Job.State.FAILED


def test_view_permission_inspects_but_cannot_act(viewer: Client) -> None:
    job = failed_job()
    response = viewer.get(JOBS)
    assert response.status_code == 200
    assert ids_listed(response) == [job.pk]
    assert "retry_jobs" not in response.content.decode()
    detail = viewer.get(job_url(job))
    assert detail.status_code == 200
    assert b"ValueError: boom" in detail.content
    assert b"Retry now" not in detail.content
    assert b'name="_save"' not in detail.content

    for name in ("retry_jobs", "cancel_jobs", "delete_selected"):
        assert action(viewer, name, [job]).status_code == 403
    assert viewer.post(job_url(job), {"state": "available"}).status_code == 403
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert not LogEntry.objects.exists()


def test_view_permission_cannot_pause_queues(viewer: Client) -> None:
    queue = QueueFactory(name="emails")
    assert viewer.get(QUEUES).status_code == 200
    assert action(viewer, "pause_queues", [queue], url=QUEUES).status_code == 403
    queue.refresh_from_db()
    assert not queue.is_paused


def test_change_permission_does_not_delete(changer: Client) -> None:
    job = failed_job()
    assert "delete_selected" not in changer.get(JOBS).content.decode()
    assert action(changer, "delete_selected", [job]).status_code == 403
    assert Job.objects.filter(pk=job.pk).exists()


def test_the_detail_page_saves_nothing_even_with_change_permission(changer: Client) -> None:
    job = failed_job()
    detail = changer.get(job_url(job))
    assert b'name="_save"' not in detail.content
    assert b"Retry now" in detail.content
    assert changer.post(job_url(job), {"task": "other"}).status_code == 403
    assert Job.objects.get(pk=job.pk).task == job.task


def test_nothing_can_be_added(superuser: Client) -> None:
    for model in ("job", "batch", "queue", "workerprocess"):
        assert superuser.get(reverse(f"admin:django_eddyq_{model}_add")).status_code == 403


# Arguments, results and tracebacks: only with view_job_payload.

SECRETS = {
    "arg": "arg-s3cret",
    "kwarg": "kwarg-s3cret",
    "result": "result-s3cret",
    "frame": "frame-s3cret",
    "odd error entry": "entry-s3cret",
    "callback arg": "callback-arg-s3cret",
    "callback kwarg": "callback-kwarg-s3cret",
}


def job_and_batch_with_secrets() -> tuple[Job, Batch]:
    batch = BatchFactory(
        callback_task="tests.jobs.add",
        callback_args=[SECRETS["callback arg"]],
        callback_kwargs={"token": SECRETS["callback kwarg"]},
    )
    job = failed_job(
        batch=batch,
        args=[SECRETS["arg"]],
        kwargs={"token": SECRETS["kwarg"]},
        result={"value": SECRETS["result"]},
        errors=[
            {
                "attempt": 1,
                "at": "2030-01-01T00:00:00",
                "error": "ValueError: boom",
                "traceback": f"Traceback (most recent call last):\n  {SECRETS['frame']}\n",
            },
            SECRETS["odd error entry"],
        ],
    )
    return job, batch


def pages_of(client: Client, job: Job, batch: Batch) -> str:
    pages = [
        client.get(url)
        for url in (job_url(job), reverse("admin:django_eddyq_batch_change", args=[batch.pk]))
    ]
    assert [page.status_code for page in pages] == [200, 200]
    return "".join(page.content.decode() for page in pages)


def test_view_permission_alone_hides_arguments_results_and_tracebacks(viewer: Client) -> None:
    job, batch = job_and_batch_with_secrets()
    html = pages_of(viewer, job, batch)
    for name, secret in SECRETS.items():
        assert secret not in html, name
    assert "Hidden: needs the view_job_payload permission" in html
    assert "ValueError: boom" in html  # the error itself stays: what the list shows too
    assert "Attempt 1" in html
    # Nor can the arguments be searched, or filtered on.
    assert ids_listed(viewer.get(JOBS, {"q": SECRETS["arg"]})) == []
    assert ids_listed(viewer.get(JOBS, {"q": "tests.jobs.add"})) == [job.pk]
    assert "arguments" not in str(viewer.get(JOBS).context["cl"].search_help_text)
    assert viewer.get(JOBS, {"args__contains": f'["{SECRETS["arg"]}"]'}).status_code == 302


@pytest.mark.parametrize("who", ["payload viewer", "superuser"])
def test_view_job_payload_shows_them(superuser: Client, who: str) -> None:
    client = (
        staff_client("view_job", "view_batch", "view_job_payload")
        if who == "payload viewer"
        else superuser
    )
    job, batch = job_and_batch_with_secrets()
    html = pages_of(client, job, batch)
    for name, secret in SECRETS.items():
        assert secret in html, name
    assert "hidden: needs" not in html.lower()
    assert ids_listed(client.get(JOBS, {"q": SECRETS["arg"]})) == [job.pk]
    assert ids_listed(client.get(JOBS, {"q": SECRETS["kwarg"]})) == [job.pk]


# The list: columns, filters, search, order.


def test_columns(superuser: Client) -> None:
    job = failed_job(queue="emails", max_attempts=3)
    running = JobFactory(state=Job.State.RUNNING, attempt=2)
    html = superuser.get(JOBS).content.decode()
    assert 'class="eddyq-state eddyq-state-failed"' in html
    assert 'class="eddyq-state eddyq-state-running"' in html
    assert "1 / 3" in html
    assert "2 / 25" in html
    assert "ValueError: boom" in html
    assert "Traceback" not in html  # only the first line of the last error
    assert job.task in html
    assert running.pk in ids_listed(superuser.get(JOBS))


def test_newest_first_and_only_by_id(superuser: Client) -> None:
    jobs = [JobFactory() for _ in range(3)]
    assert ids_listed(superuser.get(JOBS)) == [job.pk for job in reversed(jobs)]
    # Sorting by a column without an index is not offered.
    html = superuser.get(JOBS).content.decode()
    assert html.count('class="sortable') == 1


def test_state_filter(superuser: Client) -> None:
    failed = failed_job()
    JobFactory()
    JobFactory(finished=True)
    assert ids_listed(superuser.get(JOBS, {"state__exact": "failed"})) == [failed.pk]


def test_queue_filter_choices_come_from_the_queue_table(superuser: Client) -> None:
    QueueFactory(name="emails")
    QueueFactory(name="reports")
    in_emails = JobFactory(queue="emails")
    JobFactory(queue="reports")
    JobFactory(queue="not-in-the-table")
    response = superuser.get(JOBS)
    spec = next(spec for spec in response.context["cl"].filter_specs if spec.title == "queue")
    assert [choice for choice, _label in spec.lookup_choices] == ["emails", "reports"]
    assert ids_listed(superuser.get(JOBS, {"queue": "emails"})) == [in_emails.pk]
    # A queue without a row can still be filtered by URL.
    assert len(ids_listed(superuser.get(JOBS, {"queue": "not-in-the-table"}))) == 1


def test_task_filter(superuser: Client) -> None:
    adds = [
        JobFactory(task="tests.jobs.add", finished=True),
        JobFactory(task="tests.jobs.add", failed=True),
        JobFactory(task="tests.jobs.add", state=Job.State.SCHEDULED),
    ]
    echo = JobFactory(task="tests.jobs.echo", failed=True)
    passing = JobFactory(task="tests.jobs.record")  # available: passing through
    response = superuser.get(JOBS)
    spec = next(spec for spec in response.context["cl"].filter_specs if spec.title == "task")
    # The choices are the tasks of the jobs that stay: not those only available or running.
    assert [choice for choice, _label in spec.lookup_choices] == [
        "tests.jobs.add",
        "tests.jobs.echo",
    ]
    assert ids_listed(superuser.get(JOBS, {"task": "tests.jobs.echo"})) == [echo.pk]
    assert set(ids_listed(superuser.get(JOBS, {"task": "tests.jobs.add"}))) == {
        job.pk for job in adds
    }
    # Any task can be filtered by URL, whatever its jobs' states.
    assert ids_listed(superuser.get(JOBS, {"task": "tests.jobs.record"})) == [passing.pk]


def test_task_names_stop_at_their_limit() -> None:
    for n in range(5):
        JobFactory(task=f"tests.jobs.task_{n}", finished=True)
    assert inspection.task_names(limit=3) == [f"tests.jobs.task_{n}" for n in range(3)]


def test_task_filter_reads_the_task_index() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql.TASK_NAMES, {"limit": 10})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "eddyq_jobs_task_idx" in plan
    assert "Seq Scan" not in plan


def test_failed_jobs_of_a_task_are_found_by_the_task_index() -> None:
    JobFactory(task="tests.jobs.add", failed=True)
    queryset = Job.objects.filter(task="tests.jobs.add", state=Job.State.FAILED)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    assert "eddyq_jobs_task_idx" in queryset.explain()


def test_batch_filter(superuser: Client) -> None:
    batch = BatchFactory()
    in_batch = JobFactory(batch=batch)
    JobFactory()
    response = superuser.get(JOBS, {"batch": str(batch.pk)})
    assert ids_listed(response) == [in_batch.pk]
    assert ids_listed(superuser.get(JOBS, {"batch": "nonsense"})) == []


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("add", {"add"}),
        ("ECHO", {"echo"}),
        ("acct-42", {"echo"}),
        ("welcome", {"kwargs"}),
        ('"acct-42"', {"echo"}),
        ("nothing-matches", set()),
    ],
)
def test_search(superuser: Client, term: str, expected: set[str]) -> None:
    jobs = {
        "add": JobFactory(task="tests.jobs.add", args=[1, 2]),
        "echo": JobFactory(task="tests.jobs.echo", args=["acct-42"]),
        "kwargs": JobFactory(task="tests.jobs.record", args=[], kwargs={"label": "welcome"}),
    }
    found = set(ids_listed(superuser.get(JOBS, {"q": term})))
    assert found == {jobs[name].pk for name in expected}


def test_search_by_id(superuser: Client) -> None:
    jobs = [JobFactory(args=[]) for _ in range(3)]
    JobFactory(args=[jobs[1].pk])  # a number finds the id only, at once
    assert ids_listed(superuser.get(JOBS, {"q": f" {jobs[1].pk} "})) == [jobs[1].pk]
    assert ids_listed(superuser.get(JOBS, {"q": str(2**64)})) == []


def test_search_for_a_number_in_context(superuser: Client) -> None:
    wanted = JobFactory(args=[], kwargs={"user_id": 42})
    JobFactory(args=[], kwargs={"user_id": 420})
    JobFactory(args=[42], kwargs={})
    assert ids_listed(superuser.get(JOBS, {"q": '"user_id": 42}'})) == [wanted.pk]


def test_jobs_past_their_retention_never_appear(superuser: Client) -> None:
    now = timezone.now()
    expired = failed_job(finalized_at=now - timedelta(days=8))
    kept = failed_job(finalized_at=now - timedelta(days=6))
    assert ids_listed(superuser.get(JOBS)) == [kept.pk]
    assert superuser.get(job_url(expired)).status_code == 302  # "doesn't exist"
    overview = superuser.get(JOBS).context["eddyq_overview"]
    assert {item.state: item.count.value for item in overview.states}["failed"] == 1


# Odd input: a normal page, never a 500.

#: Values that are not an id, though some look like one to str.isdigit() or int().
NOT_IDS = [
    "²",  # isdigit() is True, int() refuses it
    "9" * 5000,  # int() refuses more than 4300 digits
    str(2**63),  # past bigint
    str(2**64),
    "-1",
    "-" + "9" * 30,
    "+1",
    "1_0",
    "1e3",
    "0x1f",
    "abc",
    "",
]


def arabic_indic(number: int) -> str:
    """``number`` in Arabic-Indic digits, which int() reads but an id is not written in."""
    return "".join(chr(0x0660 + int(digit)) for digit in str(number))


def test_searching_what_is_not_an_id(superuser: Client) -> None:
    job = JobFactory(args=[])
    for term in (*NOT_IDS, arabic_indic(job.pk), f"{job.pk}\n{job.pk}"):
        response = superuser.get(JOBS, {"q": term})
        assert response.status_code == 200, term[:12]
        assert ids_listed(response) == ([] if term else [job.pk]), term[:12]


def test_batch_filter_of_what_is_not_an_id(superuser: Client) -> None:
    batch = BatchFactory()
    job = JobFactory(batch=batch)
    for value in (*NOT_IDS, arabic_indic(batch.pk)):
        response = superuser.get(JOBS, {"batch": value})
        assert response.status_code == 200, value[:12]
        assert ids_listed(response) == ([] if value else [job.pk]), value[:12]


ODD_VALUES = [*NOT_IDS, "\x00", "a\x00b", "(", "[", "\\", "'", "%", "x" * 5000]
LIST_PARAMETERS = [
    (JOBS, "q"),
    (JOBS, "state__exact"),
    (JOBS, "queue"),
    (JOBS, "task"),
    (JOBS, "batch"),
    (JOBS, "p"),
    (JOBS, "o"),
    (BATCHES, "q"),
    (BATCHES, "state__exact"),
    (BATCHES, "p"),
    (QUEUES, "q"),
    (QUEUES, "paused_at__isempty"),
    (WORKERS, "status"),
    (WORKERS, "host"),
    (WORKERS, "p"),
    (WORKERS, "o"),
]


@pytest.mark.parametrize(("url", "parameter"), LIST_PARAMETERS)
def test_odd_list_parameters_get_a_normal_page(superuser: Client, url: str, parameter: str) -> None:
    failed_job(batch=BatchFactory())
    QueueFactory(name="default")
    registry()
    for value in ODD_VALUES:
        response = superuser.get(url, {parameter: value})
        # The list, or Django's redirect for parameters it cannot use (?e=1).
        assert response.status_code in (200, 302), value[:12]


@pytest.mark.parametrize(
    "lookup",
    [
        {"state__regex": "("},  # the database refuses the pattern
        {"task__iregex": "["},
        {"queue": "x", "attempt__gt": "²"},
        {"args__contains": '["x"]'},
        {"kwargs__token": "x"},
        {"errors__icontains": "Traceback"},
        {"id__in": "1,2"},
    ],
)
def test_only_the_filters_lookups_are_taken_from_the_url(
    superuser: Client, lookup: dict[str, str]
) -> None:
    failed_job()
    response = superuser.get(JOBS, lookup)
    assert response.status_code == 302
    assert response["Location"] == f"{JOBS}?e=1"


def test_every_filter_choice_works(superuser: Client) -> None:
    QueueFactory(name="default", paused_at=timezone.now())
    failed_job(batch=BatchFactory())
    registry()
    for url in (JOBS, f"{JOBS}?batch={Batch.objects.get().pk}", BATCHES, QUEUES, WORKERS):
        changelist = superuser.get(url).context["cl"]
        for spec in changelist.filter_specs:
            for choice in spec.choices(changelist):
                page = superuser.get(url.split("?")[0] + choice["query_string"])
                assert page.status_code == 200, choice["query_string"]


def test_odd_object_urls_are_missing_objects(superuser: Client) -> None:
    job = failed_job(batch=BatchFactory())
    QueueFactory(name="default")
    registry()
    odd_keys = [*NOT_IDS[:4], "1\x00"]
    urls = [
        *[("job", key) for key in [*odd_keys, arabic_indic(job.pk)]],
        *[("batch", key) for key in [*odd_keys, arabic_indic(job.batch_id or 0)]],
        ("queue", "default\x00"),  # PostgreSQL text holds no NUL
        ("queue", "x" * 5000),
        ("workerprocess", "web-1:1:live\x00"),
        ("workerprocess", "x" * 5000),
    ]
    for model, key in urls:
        for view in ("change", "history"):
            response = superuser.get(reverse(f"admin:django_eddyq_{model}_{view}", args=[key]))
            # "Doesn't exist", back to the admin's index.
            assert response.status_code == 302, (model, view, key[:12])
            assert response["Location"] == reverse("admin:index")


def test_odd_selections_change_nothing(changer: Client) -> None:
    job = failed_job()
    QueueFactory(name="default")
    for value in (*NOT_IDS, "\x00", arabic_indic(job.pk)):
        for name, url in (("retry_jobs", JOBS), ("pause_queues", QUEUES)):
            data = {"action": name, "index": "0", "_selected_action": [value]}
            assert changer.post(url, data).status_code == 302, (name, value[:12])
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert not Queue.objects.get().is_paused
    assert not LogEntry.objects.exists()


def test_any_index_still_needs_the_actions_permission(changer: Client) -> None:
    """Django picks the action by ``index`` its own way (any script's digits, the last one
    when out of range): whichever it picks, an action the user may not run is refused."""
    job = failed_job()
    selected = {"_selected_action": [str(job.pk)]}
    for index in (*NOT_IDS, arabic_indic(1), "7"):
        both = {"action": ["retry_jobs", "delete_selected"], "index": index, **selected}
        assert changer.post(JOBS, both).status_code == 403, index[:12]
        assert Job.objects.filter(pk=job.pk).exists()
        allowed = {"action": "retry_jobs", "index": index, **selected}
        assert changer.post(JOBS, allowed).status_code == 302, index[:12]


# Retention deadlines: the same rule as the cleaner's.

HOUR = timedelta(hours=1)
RETENTION = {"completed": "1h", "failed": "7d", "cancelled": None, "batch": "7d"}
# (state, Job.retention, the deadline after finalized_at, or None for forever)
DEADLINES: dict[str, tuple[str, Any, timedelta | None]] = {
    "completed by RETENTION": ("completed", None, HOUR),
    "failed by RETENTION": ("failed", None, timedelta(days=7)),
    "cancelled kept forever by RETENTION": ("cancelled", None, None),
    "override in seconds": ("completed", {"completed": 7200.5}, timedelta(seconds=7200.5)),
    "override shorter": ("failed", {"failed": 60}, timedelta(seconds=60)),
    "override None keeps forever": ("completed", {"completed": None}, None),
    "override for another state": ("completed", {"failed": 5}, HOUR),
    "override not a number keeps forever": ("completed", {"completed": "1h"}, None),
    "override true is no number": ("completed", {"completed": True}, None),
    "array naming the state keeps forever": ("completed", ["completed"], None),
    "array naming another state": ("completed", ["failed"], HOUR),
    "override beyond the calendar": ("failed", {"failed": 1e300}, None),
    "override of zero": ("cancelled", {"cancelled": 0}, timedelta(0)),
}


@override_settings(EDDYQ={"RETENTION": RETENTION})
@pytest.mark.parametrize(
    ("state", "override", "period"), list(DEADLINES.values()), ids=list(DEADLINES)
)
def test_retention_deadline_is_when_the_cleaner_deletes(
    state: str, override: Any, period: timedelta | None
) -> None:
    finalized_at = datetime(2030, 1, 1, tzinfo=UTC)
    job = JobFactory(state=state, finalized_at=finalized_at, retention=override)
    deadline = retention.job_retention_deadline(job)
    if period is None:
        assert deadline is None
        assert Cleaner().run_once(now=datetime(9999, 1, 1, tzinfo=UTC)) == 0
        return
    assert deadline == finalized_at + period
    assert Cleaner().run_once(now=deadline - MICROSECOND) == 0
    assert Job.all_objects.filter(pk=job.pk).exists()
    assert Cleaner().run_once(now=deadline) == 1
    assert not Job.all_objects.filter(pk=job.pk).exists()


def test_retention_deadline_of_a_job_without_finalized_at() -> None:
    assert retention.retention_deadline("failed", None, None) is None
    with pytest.raises(ValueError, match="not a terminal state"):
        retention.retention_deadline("running", timezone.now(), None)


@override_settings(EDDYQ={"RETENTION": RETENTION})
def test_retention_column(superuser: Client) -> None:
    finalized_at = timezone.now()
    completed = JobFactory(finished=True, finalized_at=finalized_at)
    cancelled = JobFactory(state="cancelled", finalized_at=finalized_at)
    JobFactory()
    response = superuser.get(JOBS)
    admin = response.context["cl"].model_admin
    rows = {job.pk: job for job in response.context["cl"].result_list}
    assert admin.retention_display(rows[cancelled.pk]) == "kept forever"
    assert admin.retention_display(rows[completed.pk]) == format_datetime(finalized_at + HOUR)
    html = response.content.decode()
    assert "kept forever" in html
    assert format_datetime(finalized_at + HOUR) in html


# Actions: through the API, one log entry per job changed.


def log_entries(flag: int) -> dict[str, str]:
    return {
        entry.object_id: entry.change_message
        for entry in LogEntry.objects.filter(action_flag=flag).order_by("pk")
    }


def test_retry_action(changer: Client) -> None:
    failed = failed_job()
    cancelled = JobFactory(state="cancelled", finalized_at=timezone.now())
    completed = JobFactory(finished=True)
    running = JobFactory(state="running")
    response = action(changer, "retry_jobs", [failed, cancelled, completed, running])
    assert response.status_code == 302
    for job in (failed, cancelled):
        job.refresh_from_db()
        assert job.state == Job.State.AVAILABLE
        assert job.finalized_at is None
    completed.refresh_from_db()
    running.refresh_from_db()
    assert (completed.state, running.state) == ("completed", "running")
    assert log_entries(CHANGE) == {
        str(failed.pk): "Retried: failed → available",
        str(cancelled.pk): "Retried: cancelled → available",
    }
    shown = messages_of(changer.get(JOBS))
    assert any(f"#{failed.pk}" in m and "available now" in m for m in shown)
    assert any(f"#{completed.pk}" in m and "cannot be retried" in m for m in shown)
    assert any(f"#{running.pk}" in m and "already available or running" in m for m in shown)


def test_retried_job_leaves_the_failed_filter(changer: Client) -> None:
    job = failed_job()
    assert ids_listed(changer.get(JOBS, {"state__exact": "failed"})) == [job.pk]
    action(changer, "retry_jobs", [job], url=f"{JOBS}?state__exact=failed")
    assert ids_listed(changer.get(JOBS, {"state__exact": "failed"})) == []


def test_cancel_action(changer: Client) -> None:
    available = JobFactory()
    running = JobFactory(state="running", locked_by="w1", locked_until=timezone.now())
    failed = failed_job()
    action(changer, "cancel_jobs", [available, running, failed])
    available.refresh_from_db()
    running.refresh_from_db()
    failed.refresh_from_db()
    assert available.state == Job.State.CANCELLED
    assert running.state == Job.State.RUNNING
    assert running.cancel_requested_at is not None
    assert failed.state == Job.State.FAILED
    assert log_entries(CHANGE) == {
        str(available.pk): "Cancelled: available → cancelled",
        str(running.pk): "Cancel requested: its worker stops it",
    }
    # A second cancel of the running job changes nothing and logs nothing.
    action(changer, "cancel_jobs", [running])
    assert LogEntry.objects.count() == 2
    assert b"cancel requested" in changer.get(JOBS).content


def test_cancelling_the_last_job_of_a_batch_fires_its_callback(changer: Client) -> None:
    from django_eddyq import batch as open_batch
    from tests import jobs as tasks

    with open_batch(on_complete=tasks.add, args=(1, 2)) as created:
        job = tasks.add.enqueue(1, 2)
    action(changer, "cancel_jobs", [job])
    created.refresh_from_db()
    assert created.state == Batch.State.COMPLETE
    assert Job.objects.filter(pk=created.callback_job, task="tests.jobs.add").exists()


def test_actions_from_the_job_page_return_to_it(changer: Client) -> None:
    job = failed_job()
    response = action(changer, "retry_jobs", [job], _eddyq_from_job="1")
    assert response.status_code == 302
    assert response["Location"] == job_url(job)
    page = changer.get(job_url(job)).content.decode()
    assert "Retry now" not in page  # available now
    assert 'value="cancel_jobs"' in page


def test_delete_action_asks_then_deletes_ended_jobs_only(deleter: Client) -> None:
    failed = failed_job()
    completed = JobFactory(finished=True)
    running = JobFactory(state="running")
    confirm = action(deleter, "delete_selected", [failed, completed, running])
    assert confirm.status_code == 200
    assert b"Yes, I" in confirm.content
    assert Job.objects.count() == 3
    response = action(deleter, "delete_selected", [failed, completed, running], post="yes")
    assert response.status_code == 302
    assert set(Job.all_objects.values_list("pk", flat=True)) == {running.pk}
    assert set(log_entries(DELETION)) == {str(failed.pk), str(completed.pk)}
    shown = messages_of(deleter.get(JOBS))
    assert any(f"#{running.pk}" in m and "Cancel them first" in m for m in shown)


def test_a_running_job_cannot_be_deleted_from_its_page(superuser: Client) -> None:
    running = JobFactory(state="running")
    assert b"deletelink" not in superuser.get(job_url(running)).content
    delete_url = reverse("admin:django_eddyq_job_delete", args=[running.pk])
    assert superuser.post(delete_url, {"post": "yes"}).status_code == 403
    assert Job.objects.filter(pk=running.pk).exists()
    ended = failed_job()
    assert b"deletelink" in superuser.get(job_url(ended)).content
    superuser.post(reverse("admin:django_eddyq_job_delete", args=[ended.pk]), {"post": "yes"})
    assert not Job.all_objects.filter(pk=ended.pk).exists()
    assert set(log_entries(DELETION)) == {str(ended.pk)}


def test_actions_refuse_more_than_their_limit(
    changer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_eddyq import admin as eddyq_admin

    monkeypatch.setattr(eddyq_admin, "ACTION_LIMIT", 2)
    jobs = [failed_job() for _ in range(3)]
    response = changer.post(
        f"{JOBS}?state__exact=failed",
        {"action": "retry_jobs", "index": "0", "select_across": "1", "_selected_action": "0"},
    )
    assert response.status_code == 302
    assert all(Job.objects.get(pk=job.pk).state == "failed" for job in jobs)
    assert any("at most 2" in m for m in messages_of(changer.get(JOBS)))


def test_pause_and_resume_queues(changer: Client) -> None:
    emails = QueueFactory(name="emails")
    reports = QueueFactory(name="reports")
    action(changer, "pause_queues", [emails, reports], url=QUEUES)
    assert all(queue.is_paused for queue in Queue.objects.all())
    action(changer, "pause_queues", [emails], url=QUEUES)  # already paused: no entry
    assert log_entries(CHANGE) == {"emails": "Paused", "reports": "Paused"}
    page = changer.get(QUEUES).content.decode()
    assert "paused since" in page
    action(changer, "resume_queues", [emails], url=QUEUES)
    assert not Queue.objects.get(name="emails").is_paused
    assert Queue.objects.get(name="reports").is_paused
    assert LogEntry.objects.filter(object_id="emails", change_message="Resumed").count() == 1


# Escaping.

SCRIPT = "<script>alert('eddyq')</script>"


def test_everything_is_escaped(superuser: Client) -> None:
    job = JobFactory(
        task=f"tests.jobs.{SCRIPT}",
        args=[SCRIPT],
        kwargs={SCRIPT: SCRIPT},
        queue="q",
        state="failed",
        finalized_at=timezone.now(),
        result={"html": SCRIPT},
        metadata={"note": SCRIPT},
        errors=[
            {"attempt": 1, "at": SCRIPT, "error": f"ValueError: {SCRIPT}", "traceback": SCRIPT}
        ],
        locked_by=SCRIPT,
    )
    for url in (JOBS, f"{JOBS}?q=script", job_url(job)):
        html = superuser.get(url).content.decode()
        assert SCRIPT not in html, url
        assert "&lt;script&gt;alert(" in html, url


def test_batch_callback_is_escaped(superuser: Client) -> None:
    batch = BatchFactory(callback_task=SCRIPT, callback_args=[SCRIPT])
    for url in (BATCHES, reverse("admin:django_eddyq_batch_change", args=[batch.pk])):
        html = superuser.get(url).content.decode()
        assert SCRIPT not in html
        assert "&lt;script&gt;" in html


# The job's page.


def test_job_page_shows_everything(superuser: Client) -> None:
    batch = BatchFactory()
    job = JobFactory(
        state="retryable",
        attempt=2,
        args=[{"user": 42, "tags": ["a", "b"]}],
        kwargs={"lang": "fr"},
        batch=batch,
        errors=[
            {
                "attempt": 1,
                "at": "2030-01-01T00:00:00",
                "error": "KeyError: 'first'",
                "traceback": "Traceback (most recent call last):\n  first frame\nKeyError\n",
            },
            {
                "attempt": 2,
                "at": "2030-01-01T00:01:00",
                "error": "JobRescued: worker w9 ...",
                "traceback": "",
                "rescued_from": "w9",
            },
        ],
    )
    html = superuser.get(job_url(job)).content.decode()
    assert '<pre class="eddyq-json">[\n  {\n    &quot;' in html  # indented
    assert "&quot;user&quot;: 42" in html
    assert "&quot;lang&quot;: &quot;fr&quot;" in html
    first = html.index("KeyError: &#x27;first&#x27;")
    assert html.index("first frame") > first
    assert html.index("JobRescued: worker w9") > html.index("first frame")
    assert "rescued from w9" in html
    assert reverse("admin:django_eddyq_batch_change", args=[batch.pk]) in html


def test_job_page_shows_the_lease_of_a_running_job(superuser: Client) -> None:
    now = timezone.now()
    running = JobFactory(
        state="running",
        locked_by="web-3:4242:abc",
        locked_until=now + timedelta(seconds=40),
        heartbeat_at=now,
    )
    html = superuser.get(job_url(running)).content.decode()
    assert "Leased to web-3:4242:abc until" in html
    assert "last heartbeat" in html
    stuck = JobFactory(state="running", locked_by="w2", locked_until=now - timedelta(minutes=1))
    assert "expired, the rescuer takes it back" in superuser.get(job_url(stuck)).content.decode()


# The overview above the list.


def test_overview_counts_per_state_and_queue(superuser: Client) -> None:
    QueueFactory(name="default")
    QueueFactory(name="emails", paused_at=timezone.now())
    for _ in range(3):
        failed_job()
    JobFactory(queue="emails")
    JobFactory(queue="emails")
    JobFactory(state="running", locked_until=timezone.now() - timedelta(seconds=5))
    JobFactory(state="pending")  # a workflow's step waiting for others
    overview = superuser.get(JOBS).context["eddyq_overview"]
    counts = {item.state: str(item.count) for item in overview.states}
    assert counts == {
        "pending": "1",
        "scheduled": "0",
        "available": "2",
        "running": "1",
        "retryable": "0",
        "completed": "0",
        "failed": "3",
        "cancelled": "0",
    }
    assert overview.stuck.value == 1
    queues = {queue.name: queue for queue in overview.queues}
    assert (queues["emails"].available.value, queues["emails"].is_paused) == (2, True)
    assert (queues["default"].running, queues["default"].is_paused) == (1, False)
    html = superuser.get(JOBS).content.decode()
    assert "1 running job is past its lease" in html
    assert "paused since" in html


@override_settings(EDDYQ={"RETENTION": RETENTION})
def test_overview_leaves_out_expired_jobs() -> None:
    now = timezone.now()
    JobFactory(finished=True, finalized_at=now - 2 * HOUR)  # expired by RETENTION
    JobFactory(finished=True, finalized_at=now)
    JobFactory(state="cancelled", finalized_at=now - HOUR, retention={"cancelled": 60})
    JobFactory(state="cancelled", finalized_at=now - HOUR)  # kept forever
    failed_job(finalized_at=now - HOUR, retention={"failed": 7200})
    counts = {item.state: item.count.value for item in inspection.Overview().states}
    assert (counts["completed"], counts["cancelled"], counts["failed"]) == (1, 1, 1)
    assert Job.objects.filter(state__in=["completed", "cancelled", "failed"]).count() == 3


def test_overview_estimates_past_its_limit() -> None:
    for _ in range(6):
        JobFactory(finished=True)
    failed_job()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE eddyq_jobs")
    overview = inspection.Overview(count_limit=5)
    counts = {item.state: item.count for item in overview.states}
    assert counts["failed"] == inspection.Count(1)
    assert counts["completed"].estimated
    assert counts["completed"].value == 6
    assert str(counts["completed"]) == "≈ 6"


def test_overview_without_statistics_says_more_than() -> None:
    for _ in range(6):
        JobFactory(finished=True)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pg_statistic WHERE starelid = 'eddyq_jobs'::regclass")
    counts = {item.state: item.count for item in inspection.Overview(count_limit=5).states}
    assert str(counts["completed"]) == "5+"


def test_overview_leader(superuser: Client) -> None:
    assert "No leader is running maintenance" in superuser.get(JOBS).content.decode()
    now = timezone.now()
    Leader.objects.create(
        name=ELECTION, leader_id="web-1:99:abc", elected_at=now, expires_at=now + HOUR
    )
    html = superuser.get(JOBS).content.decode()
    assert "Leader <code>web-1:99:abc</code> runs maintenance" in html
    Leader.objects.filter(name=ELECTION).update(expires_at=now - HOUR)
    html = superuser.get(JOBS).content.decode()
    assert "No leader is running maintenance" in html
    assert "The last leader, <code>web-1:99:abc</code>" in html


# Counts that stop, estimates, and query counts that do not grow with rows.


@pytest.fixture
def small_count_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(inspection.EstimatingPaginator, "exact_limit", 5)
    return 5


def test_exact_count_up_to_the_limit(superuser: Client, small_count_limit: int) -> None:
    for _ in range(5):
        JobFactory()
    response = superuser.get(JOBS)
    assert response.context["cl"].result_count == 5
    assert not response.context["cl"].paginator.is_estimate
    assert "about" not in response.content.decode()


def test_unfiltered_count_past_the_limit_is_the_table_estimate(
    superuser: Client, small_count_limit: int
) -> None:
    for _ in range(12):
        JobFactory()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE eddyq_jobs")
    with CaptureQueriesContext(connection) as queries:
        response = superuser.get(JOBS)
    cl = response.context["cl"]
    assert cl.paginator.is_estimate
    assert cl.result_count == 12
    assert "about 12 jobs" in response.content.decode()
    counts = [q["sql"] for q in queries if q["sql"].startswith("SELECT COUNT(*)")]
    assert counts
    assert all("LIMIT 6" in sql for sql in counts), counts
    assert any("reltuples" in q["sql"] for q in queries)


def test_filtered_count_past_the_limit_is_the_planner_estimate(
    superuser: Client, small_count_limit: int
) -> None:
    for _ in range(8):
        failed_job()
    JobFactory()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE eddyq_jobs")
    with CaptureQueriesContext(connection) as queries:
        response = superuser.get(JOBS, {"state__exact": "failed"})
    cl = response.context["cl"]
    assert cl.paginator.is_estimate
    assert cl.result_count >= 6
    assert any(q["sql"].startswith("EXPLAIN") for q in queries)


def test_pages_past_an_estimate_are_empty_not_errors(
    superuser: Client, small_count_limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_eddyq.admin import JobAdmin

    monkeypatch.setattr(JobAdmin, "list_per_page", 2)
    for _ in range(8):
        JobFactory()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE eddyq_jobs")
        cursor.execute("UPDATE pg_class SET reltuples = 1000 WHERE oid = 'eddyq_jobs'::regclass")
    response = superuser.get(JOBS, {"p": "400"})
    assert response.status_code == 200
    assert ids_listed(response) == []
    page_links = re.findall(r'href="\?p=(\d+)"', superuser.get(JOBS).content.decode())
    assert max(int(p) for p in page_links) <= 4  # no link to a "last" page far away


def count_queries(client: Client, url: str, data: dict[str, str] | None = None) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, data or {})
    assert response.status_code == 200
    return len(queries)


def many_kinds_of_jobs(copies: int) -> None:
    QueueFactory(name="default")
    for n in range(copies):
        batch = BatchFactory(callback_task="tests.jobs.add")
        failed_job(batch=batch, retention={"failed": 60 * n})
        JobFactory(state="running", locked_by="w", locked_until=timezone.now(), batch=batch)
        JobFactory(finished=True, task=f"tests.jobs.task_{n % 3}")
        JobFactory(state="cancelled", finalized_at=timezone.now(), queue=f"queue-{n % 2}")
        QueueFactory(name=f"queue-{n % 2}")


LIST_VIEWS: list[tuple[str, dict[str, str]]] = [
    (JOBS, {}),
    (JOBS, {"state__exact": "failed"}),
    (JOBS, {"queue": "default", "task": "tests.jobs.add"}),
    (JOBS, {"q": "add"}),
    (BATCHES, {}),
    (QUEUES, {}),
]


@pytest.mark.parametrize(
    ("url", "data"), LIST_VIEWS, ids=[f"{u}?{urlencode(d)}" for u, d in LIST_VIEWS]
)
def test_list_query_count_does_not_grow_with_rows(
    superuser: Client, url: str, data: dict[str, str]
) -> None:
    many_kinds_of_jobs(2)
    few = count_queries(superuser, url, data)
    many_kinds_of_jobs(20)
    assert count_queries(superuser, url, data) == few


def test_job_list_query_budget(superuser: Client) -> None:
    """Session and user, the count, the rows, queue and task choices, state counts, queues and
    the leader: a fixed handful."""
    many_kinds_of_jobs(5)
    assert count_queries(superuser, JOBS) <= 9


def test_job_page_query_count_does_not_grow_with_errors(superuser: Client) -> None:
    error = {"attempt": 1, "error": "E: x", "traceback": "Traceback\n"}
    one = JobFactory(state="failed", finalized_at=timezone.now(), errors=[error])
    many = JobFactory(
        state="failed", finalized_at=timezone.now(), errors=[error] * 25, batch=BatchFactory()
    )
    assert count_queries(superuser, job_url(one)) == count_queries(superuser, job_url(many))


def test_the_list_fetches_no_arguments_or_tracebacks(superuser: Client) -> None:
    failed_job(args=["x" * 1000])
    with CaptureQueriesContext(connection) as queries:
        superuser.get(JOBS)
    rows = [q["sql"] for q in queries if 'ORDER BY "eddyq_jobs"."id" DESC' in q["sql"]]
    assert rows
    assert all('"eddyq_jobs"."args"' not in sql for sql in rows)
    assert all('"eddyq_jobs"."errors" -> -1' in sql or "-> -1" in sql for sql in rows)


# Batches and queues.


def test_batch_list_and_page(superuser: Client) -> None:
    batch = BatchFactory(callback_task="tests.jobs.add", callback_args=[1, 2], callback_job=None)
    failed_job(batch=batch)
    failed_job(batch=batch)
    JobFactory(batch=batch)
    html = superuser.get(BATCHES).content.decode()
    assert "failed 2" in html
    assert "available 1" in html
    assert f"{JOBS}?batch={batch.pk}" in html
    page = superuser.get(reverse("admin:django_eddyq_batch_change", args=[batch.pk]))
    text = page.content.decode()
    assert "tests.jobs.add" in text
    assert '<pre class="eddyq-json">[\n  1,\n  2\n]</pre>' in text
    assert "failed 2" in text


def test_batch_links_its_callback_job(superuser: Client) -> None:
    callback = JobFactory()
    batch = BatchFactory(state="complete", callback_job=callback.pk, finalized_at=timezone.now())
    page = superuser.get(reverse("admin:django_eddyq_batch_change", args=[batch.pk]))
    assert job_url(callback) in page.content.decode()


def test_queue_list_counts(superuser: Client) -> None:
    QueueFactory(name="emails")
    JobFactory(queue="emails")
    JobFactory(queue="emails")
    JobFactory(queue="emails", state="running")
    failed_job(queue="emails")
    response = superuser.get(QUEUES)
    queue = response.context["cl"].result_list[0]
    assert (queue.available_count, queue.running_count) == (2, 1)
    assert f"{JOBS}?queue=emails" in response.content.decode()


def test_batches_and_queues_cannot_be_deleted(superuser: Client) -> None:
    batch = BatchFactory()
    queue = QueueFactory(name="emails")
    assert "delete_selected" not in superuser.get(BATCHES).content.decode()
    assert "delete_selected" not in superuser.get(QUEUES).content.decode()
    for url in (
        reverse("admin:django_eddyq_batch_delete", args=[batch.pk]),
        reverse("admin:django_eddyq_queue_delete", args=[queue.pk]),
    ):
        assert superuser.post(url, {"post": "yes"}).status_code == 403


# Workers.


def worker_url(worker_id: str) -> str:
    return reverse("admin:django_eddyq_workerprocess_change", args=[quote(worker_id)])


def registry() -> dict[str, WorkerProcess]:
    """A live worker that leads, one that stopped, and one lost (unseen for ten minutes, and
    leading when last seen): their times by the database's clock."""
    rows = {
        "live": ("web-1", 11, None, timedelta(seconds=2), None, 3, True),
        "stopped": ("web-2", 22, ["emails", "reports"], timedelta(minutes=2), True, 0, False),
        "lost": ("web-1", 33, ["emails"], timedelta(minutes=10), None, 2, True),
    }
    workers = {}
    for name, (host, pid, queues, seen, stopped, running, leader) in rows.items():
        worker = WorkerProcess.objects.create(
            id=f"{host}:{pid}:{name}",
            host=host,
            pid=pid,
            version="0.1.0",
            queues=queues,
            concurrency=10,
            running=running,
            leader=leader,
        )
        WorkerProcess.objects.filter(pk=worker.pk).update(
            started_at=Now() - timedelta(hours=1),
            last_seen_at=Now() - seen,
            stopped_at=Now() - seen if stopped else None,
        )
        worker.refresh_from_db()
        workers[name] = worker
    return workers


def rows_of(response: Any) -> list[tuple[str, str]]:
    return [(worker.id, worker.status) for worker in response.context["cl"].result_list]


def test_workers_list(superuser: Client) -> None:
    workers = registry()
    response = superuser.get(WORKERS)
    # Running first, then lost, then stopped.
    assert rows_of(response) == [
        (workers["live"].id, "running"),
        (workers["lost"].id, "lost"),
        (workers["stopped"].id, "stopped"),
    ]
    html = response.content.decode()
    rows = re.findall(r"<tr>.*?</tr>", html, flags=re.DOTALL)
    live, lost, stopped = (
        next(row for row in rows if f">{workers[name].id}<" in row)
        for name in ("live", "lost", "stopped")
    )
    assert 'class="eddyq-state eddyq-worker-running">running<' in live
    assert '<td class="field-queues_display">all</td>' in live
    assert re.search(r"\([2-9]s ago\)", live), live
    assert 'class="field-leader_display"><img src="/static/admin/img/icon-yes.svg"' in live
    assert 'class="eddyq-state eddyq-worker-lost">lost<' in lost
    assert re.search(r"\(10m([0-9]s)? ago\)", lost), lost
    assert "icon-unknown.svg" in lost  # it led when last seen
    assert 'class="eddyq-state eddyq-worker-stopped">stopped<' in stopped
    assert "emails, reports" in stopped
    assert "icon-no.svg" in stopped
    assert "STALE_AFTER (1m)" in html
    assert "WORKER_RETENTION (1d)" in html
    assert f'href="{worker_url(workers["lost"].id)}"' in html


def test_workers_are_lost_by_stale_after_and_the_databases_clock(superuser: Client) -> None:
    workers = registry()
    with override_settings(EDDYQ={"STALE_AFTER": "15m"}):
        statuses = dict(rows_of(superuser.get(WORKERS)))
    assert statuses[workers["lost"].id] == "running"
    # The web server's clock is not asked: rows seen "in the future" by it are no different.
    WorkerProcess.objects.filter(pk=workers["live"].pk).update(last_seen_at=Now())
    assert dict(rows_of(superuser.get(WORKERS)))[workers["live"].id] == "running"


def test_workers_filters(superuser: Client) -> None:
    workers = registry()
    assert rows_of(superuser.get(WORKERS, {"status": "lost"})) == [(workers["lost"].id, "lost")]
    assert rows_of(superuser.get(WORKERS, {"host": "web-2"})) == [
        (workers["stopped"].id, "stopped")
    ]
    assert rows_of(superuser.get(WORKERS, {"host": "web-1", "status": "running"})) == [
        (workers["live"].id, "running")
    ]
    assert rows_of(superuser.get(WORKERS, {"host": "elsewhere"})) == []
    # Sorted by a column: the status, descending (stopped first); last seen (longest ago first).
    assert rows_of(superuser.get(WORKERS, {"o": "-1"}))[0] == (workers["stopped"].id, "stopped")
    assert rows_of(superuser.get(WORKERS, {"o": "7"}))[0] == (workers["lost"].id, "lost")


def test_workers_page_of_a_worker(superuser: Client) -> None:
    workers = registry()
    html = superuser.get(worker_url(workers["lost"].id)).content.decode()
    assert "eddyq-worker-lost" in html
    assert "0.1.0" in html
    assert re.search(r"\(10m([0-9]s)? ago\)", html)
    assert 'name="_save"' not in html


def test_workers_are_view_only(superuser: Client) -> None:
    workers = registry()
    viewer = staff_client("view_workerprocess")
    for client in (viewer, superuser):
        response = client.get(WORKERS)
        assert response.status_code == 200
        assert len(rows_of(response)) == 3
        assert 'name="action"' not in response.content.decode()
        url = worker_url(workers["live"].id)
        assert client.get(url).status_code == 200
        assert client.post(url, {"host": "elsewhere"}).status_code == 403
        delete = reverse(
            "admin:django_eddyq_workerprocess_delete", args=[quote(workers["live"].id)]
        )
        assert client.post(delete, {"post": "yes"}).status_code == 403
        assert client.get(reverse("admin:django_eddyq_workerprocess_add")).status_code == 403
    assert WorkerProcess.objects.get(pk=workers["live"].pk).host == "web-1"
    assert WorkerProcess.objects.count() == 3
    assert staff_client("view_job").get(WORKERS).status_code == 403


def test_workers_list_query_count_does_not_grow_with_rows(superuser: Client) -> None:
    registry()
    few = count_queries(superuser, WORKERS)
    for n in range(30):
        WorkerProcess.objects.create(
            id=f"web-9:{n}:x", host=f"web-{n}", pid=n, version="0", concurrency=1
        )
    assert count_queries(superuser, WORKERS) == few


# Each attempt's worker on the job's page.


def summary_worker(html: str) -> str:
    """The worker field of a job page's summary."""
    return html[html.index("fieldBox field-worker_display") : html.index("fieldBox field-priority")]


def test_job_page_names_the_worker_of_each_attempt(superuser: Client) -> None:
    workers = registry()
    job = failed_job(
        attempt=3,
        attempted_by=workers["stopped"].id,
        errors=[
            {"attempt": 1, "error": "ValueError: one", "worker": workers["live"].id},
            {"attempt": 2, "error": "JobRescued: ...", "rescued_from": "gone:1:aa"},
            {"attempt": 3, "error": "ValueError: three", "worker": workers["stopped"].id},
        ],
    )
    html = superuser.get(job_url(job)).content.decode()
    live, stopped = (workers[name].id for name in ("live", "stopped"))
    # The summary: the latest attempt's worker, linked to its row.
    summary = summary_worker(html)
    assert f'<a href="{worker_url(stopped)}">{stopped}</a>' in summary
    errors = html[html.index('class="eddyq-errors"') :]
    first, second, third = errors.split('<div class="eddyq-error-heading">')[1:4]
    assert f'worker <a href="{worker_url(live)}">{live}</a>' in first
    assert "rescued from gone:1:aa" in second  # its row is gone: not linked
    assert "gone:1:aa</a>" not in second
    assert f'worker <a href="{worker_url(stopped)}">{stopped}</a>' in third


def test_job_page_names_the_worker_holding_a_running_job(superuser: Client) -> None:
    workers = registry()
    job = JobFactory(
        state="running",
        attempt=2,
        attempted_by=workers["live"].id,
        locked_by=workers["live"].id,
        locked_until=timezone.now() + timedelta(seconds=30),
    )
    html = superuser.get(job_url(job)).content.decode()
    assert f'<a href="{worker_url(workers["live"].id)}">{workers["live"].id}</a>' in html
    unknown = JobFactory(state="completed", attempt=1, attempted_by=None)
    html = superuser.get(job_url(unknown)).content.decode()
    assert ">—</div>" in summary_worker(html)


def test_job_page_links_workers_only_for_who_may_see_them(viewer: Client) -> None:
    workers = registry()
    job = failed_job(
        attempted_by=workers["live"].id,
        errors=[{"attempt": 1, "error": "ValueError: one", "worker": workers["live"].id}],
    )
    html = viewer.get(job_url(job)).content.decode()
    assert f"worker {workers['live'].id}" in html
    assert worker_url(workers["live"].id) not in html


def test_worker_ids_are_escaped(superuser: Client) -> None:
    job = failed_job(
        attempted_by=SCRIPT,
        errors=[{"attempt": 1, "error": "E: x", "worker": SCRIPT, "rescued_from": SCRIPT}],
    )
    html = superuser.get(job_url(job)).content.decode()
    assert SCRIPT not in html


# Actions on every job the filters match.


def bulk_url(operation: str, **filters: str) -> str:
    url = reverse("admin:django_eddyq_job_bulk", args=[operation])
    return f"{url}?{urlencode(filters)}" if filters else url


def test_all_matching_actions_need_their_permission(
    viewer: Client, changer: Client, deleter: Client
) -> None:
    failed_job()
    assert "eddyq-bulk-links" not in viewer.get(JOBS).content.decode()
    assert viewer.get(bulk_url("retry")).status_code == 403
    assert viewer.post(bulk_url("retry"), {"post": "yes"}).status_code == 403
    assert changer.get(bulk_url("delete")).status_code == 403
    assert deleter.post(bulk_url("cancel"), {"post": "yes"}).status_code == 403
    assert changer.get(bulk_url("explode")).status_code == 404
    page = changer.get(JOBS + "?state__exact=failed").content.decode()
    assert bulk_url("retry", state__exact="failed") in page.replace("&amp;", "&")
    assert bulk_url("delete") not in page
    assert Job.objects.get().state == "failed"


def test_retry_all_matching_confirms_then_retries_the_filtered_set(superuser: Client) -> None:
    emails = [failed_job(queue="emails") for _ in range(3)]
    other = failed_job(queue="reports")
    url = bulk_url("retry", state__exact="failed", queue="emails")
    page = superuser.get(url).content.decode()
    assert "jobs in state failed, of queue emails" in page
    assert "3 jobs match." in page
    assert Job.objects.filter(state="failed").count() == 4  # a GET changes nothing

    response = superuser.post(url, {"post": "yes"}, follow=True)
    assert "Retried 3 of 3 matching jobs; 0 left alone." in messages_of(response)
    assert response.redirect_chain[-1][0] == JOBS + "?state__exact=failed&queue=emails"
    assert {job.state for job in Job.objects.filter(pk__in=[j.pk for j in emails])} == {"available"}
    assert Job.objects.get(pk=other.pk).state == "failed"
    assert LogEntry.objects.filter(action_flag=CHANGE).count() == 3


def test_the_jobs_of_one_limit_key(superuser: Client) -> None:
    """A keyed job's page links to its task's jobs of its key; the list filters by it, and
    "all matching" acts on that key's jobs only."""
    acme = jobs.one_per_customer.enqueue_many([(0.0, "acme"), (0.0, "acme")])
    other = jobs.one_per_customer.enqueue(0.0, "globex")
    page = superuser.get(reverse("admin:django_eddyq_job_change", args=[acme[0].pk]))
    link = f"{JOBS}?task=tests.jobs.one_per_customer&amp;limit_key=acme"
    assert link in page.content.decode()
    listed = superuser.get(JOBS, {"task": "tests.jobs.one_per_customer", "limit_key": "acme"})
    assert sorted(ids_listed(listed)) == sorted(job.pk for job in acme)
    url = bulk_url("cancel", limit_key="acme")
    assert "of limit key &#x27;acme&#x27;" in superuser.get(url).content.decode()
    superuser.post(url, {"post": "yes"})
    assert set(Job.objects.filter(limit_key="acme").values_list("state", flat=True)) == {
        "cancelled"
    }
    assert Job.objects.get(pk=other.pk).state == "available"


def test_an_all_matching_action_continues_request_after_request(superuser: Client) -> None:
    from django.contrib import admin

    failed = [failed_job() for _ in range(5)]
    JobFactory(finished=True)
    job_admin = admin.site.get_model_admin(Job)
    job_admin.bulk_seconds, job_admin.bulk_batch_size = 0.0, 2
    try:
        url = bulk_url("delete", state__exact="failed")
        data = {"post": "yes"}
        pages = 0
        while True:
            response = superuser.post(url, data)
            if response.status_code == 302:
                break
            pages += 1
            result = response.context["result"]
            assert not result.done and result.changed == 2 * pages
            data = {
                "post": "yes",
                "after": str(result.after),
                "end": str(result.end),
                "matched": str(result.matched),
                "changed": str(result.changed),
                "requested": "0",
            }
    finally:
        del job_admin.bulk_seconds, job_admin.bulk_batch_size
    assert pages == 2
    assert not Job.objects.filter(pk__in=[job.pk for job in failed]).exists()
    assert Job.objects.get().state == "completed"
    assert LogEntry.objects.filter(action_flag=DELETION).count() == 5


def test_all_matching_refuses_what_is_not_a_filter_and_needs_csrf(superuser: Client) -> None:
    job = failed_job()
    response = superuser.post(bulk_url("retry", args__contains="x"), {"post": "yes"}, follow=True)
    assert "Nothing was changed: the list's filters are not valid." in messages_of(response)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(is_superuser=True))
    assert strict.post(bulk_url("retry"), {"post": "yes"}).status_code == 403
    assert Job.objects.get(pk=job.pk).state == "failed"
