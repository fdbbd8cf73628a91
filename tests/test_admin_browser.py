"""The admin in a real browser: Debian's chromium, driven by Playwright, against ``live_server``.

An operator's round: log in, filter the jobs to the failed ones, open one and read its
traceback, retry it and see it leave the failed filter, pause a queue, limit one, find the lost
workers, go from a job to the worker that ran it, and retry a failed workflow from its page.
The failed-jobs list is saved as a screenshot in ``docs/_screenshots_tmp/`` (git-ignored); with
``EDDYQ_DOCS_SCREENSHOTS=1`` it also replaces the one of docs/operators.md.

Without chromium or Playwright these tests skip, except in CI (``CI`` set), where they fail:
CI installs both.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from django_eddyq import Workflow
from django_eddyq.election import ELECTION
from django_eddyq.models import Job, Leader, PeriodicSchedule, Queue, WorkerProcess
from django_eddyq.testing import run_jobs
from tests import jobs as tasks
from tests.factories import JobFactory, QueueFactory

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("EDDYQ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SCREENSHOTS = REPO / "docs" / "_screenshots_tmp"
DOCS_SCREENSHOT = REPO / "docs" / "images" / "admin-failed-jobs.png"
USERNAME, PASSWORD = "operator", "correct horse battery staple"
TIMEOUT_MS = 15_000


def unavailable(reason: str) -> None:
    """Skip, but not in CI, where a missing browser is a broken setup."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the browser tests must run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, for the module. Playwright's sync API runs an event loop in this thread, where
    Django would refuse the tests' own queries but for DJANGO_ALLOW_ASYNC_UNSAFE."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("Playwright is not installed: pip install -e '.[test]'")
    if not (shutil.which(CHROMIUM) or os.access(CHROMIUM, os.X_OK)):
        unavailable(f"no chromium at {CHROMIUM}: apt-get install chromium")
    with pytest.MonkeyPatch.context() as monkeypatch, sync_playwright() as playwright:
        monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    """A logged-in superuser's page."""
    from django.contrib.auth.models import User

    User.objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)
    context = browser.new_context(viewport={"width": 1600, "height": 900}, locale="en-US")
    context.set_default_timeout(TIMEOUT_MS)
    # The navigation sidebar folded, as an operator who knows the way keeps it.
    context.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")
    yield page
    context.close()


def traceback_of(error: str, frames: list[str]) -> str:
    lines = ["Traceback (most recent call last):"]
    for frame in frames:
        lines += [f'  File "{frame}", in run', "    ..."]
    return "\n".join([*lines, error]) + "\n"


def failed(task: str, queue: str, error: str, frames: list[str], age: timedelta) -> Job:
    finalized_at = timezone.now() - age
    job: Job = JobFactory(
        task=task,
        queue=queue,
        state=Job.State.FAILED,
        attempt=3,
        max_attempts=3,
        args=["acct-1042"],
        kwargs={"region": "eu-west-1"},
        run_at=finalized_at - timedelta(seconds=2),
        attempted_at=finalized_at - timedelta(seconds=1),
        finalized_at=finalized_at,
        errors=[
            {
                "attempt": attempt,
                "at": (finalized_at - timedelta(minutes=3 - attempt)).isoformat(),
                "error": error,
                "exception_class": "builtins." + error.split(":")[0],
                "traceback": traceback_of(error, frames),
            }
            for attempt in (1, 2, 3)
        ],
    )
    return job


@pytest.fixture
def jobs() -> dict[str, Job]:
    """A small but lifelike queue: some of everything, a few failures, an elected leader."""
    now = timezone.now()
    for name in ("default", "emails", "reports"):
        QueueFactory(name=name)
    Leader.objects.create(
        name=ELECTION,
        leader_id="web-1:4242:9f2c",
        elected_at=now - timedelta(hours=2),
        expires_at=now + timedelta(hours=1),
    )
    for n in range(12):
        JobFactory(
            finished=True,
            task="demo.tasks.send_welcome_email",
            queue="emails",
            args=[n + 1],
            finalized_at=now - timedelta(minutes=40 - n),
        )
    for n in range(3):
        JobFactory(task="demo.tasks.build_report", queue="reports", args=[f"daily-{n}"])
    JobFactory(
        task="demo.tasks.build_report",
        queue="reports",
        state=Job.State.RUNNING,
        attempt=1,
        locked_by="web-1:4242:9f2c",
        locked_until=now + timedelta(seconds=50),
        heartbeat_at=now,
    )
    sync = failed(
        "demo.tasks.flaky_sync",
        "default",
        "ConnectionError: the CRM did not answer within 10s",
        ["demo/tasks.py", "demo/crm.py"],
        timedelta(minutes=12),
    )
    payment = failed(
        "demo.tasks.charge_card",
        "default",
        "PaymentDeclined: card ending 4242 was declined (insufficient funds)",
        ["demo/tasks.py", "demo/payments.py"],
        timedelta(minutes=5),
    )
    bad_input = failed(
        "demo.tasks.reject_bad_input",
        "emails",
        "ValueError: no email address in {'name': 'no email'}",
        ["demo/tasks.py"],
        timedelta(minutes=1),
    )
    return {"sync": sync, "payment": payment, "bad_input": bad_input}


def failed_ids(page: Any) -> list[int]:
    links = page.locator("#result_list tbody th.field-id a")
    return [int(text) for text in links.all_inner_texts()]


def save_screenshot(page: Any) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / "admin-failed-jobs.png"
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("EDDYQ_DOCS_SCREENSHOTS"):
        DOCS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_SCREENSHOT)
    return path


def test_filter_read_traceback_retry(page: Any, live_server: Any, jobs: dict[str, Job]) -> None:
    page.goto(f"{live_server.url}/admin/django_eddyq/job/")
    assert page.locator("#eddyq-overview").is_visible()
    assert "runs maintenance" in page.locator("#eddyq-leader").inner_text()

    # Filter to the failed jobs, from the filter sidebar.
    page.locator("#changelist-filter").get_by_role("link", name="failed", exact=True).click()
    page.wait_for_url("**state__exact=failed**")
    expected = sorted((job.pk for job in jobs.values()), reverse=True)
    assert failed_ids(page) == expected
    assert page.locator(".eddyq-state-failed").first.is_visible()
    assert "PaymentDeclined: card ending 4242" in page.locator("#result_list").inner_text()
    screenshot = save_screenshot(page)
    assert screenshot.stat().st_size > 10_000

    # Open one and read its traceback, every attempt in order.
    payment = jobs["payment"]
    page.locator("#result_list").get_by_role("link", name=str(payment.pk), exact=True).click()
    page.wait_for_url(f"**/job/{payment.pk}/change/**")
    tracebacks = page.locator("pre.eddyq-traceback")
    assert tracebacks.count() == 3
    text = tracebacks.nth(2).inner_text()
    assert text.startswith("Traceback (most recent call last):")
    assert 'File "demo/payments.py"' in text
    assert "PaymentDeclined: card ending 4242 was declined" in text
    assert "acct-1042" in page.locator(".field-args_json").inner_text()

    # Retry it: back on its page, available now.
    page.get_by_role("button", name="Retry now").click()
    page.wait_for_selector(".messagelist .success")
    assert "available now" in page.locator(".messagelist").inner_text()
    assert page.locator(".field-state_badge .eddyq-state-available").is_visible()
    assert Job.objects.get(pk=payment.pk).state == Job.State.AVAILABLE

    # It has left the failed filter.
    page.goto(f"{live_server.url}/admin/django_eddyq/job/?state__exact=failed")
    assert failed_ids(page) == [pk for pk in expected if pk != payment.pk]


def test_pause_a_queue(page: Any, live_server: Any, jobs: dict[str, Job]) -> None:
    page.goto(f"{live_server.url}/admin/django_eddyq/queue/")
    row = page.locator("#result_list tbody tr", has_text="emails")
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "pause_queues")
    page.get_by_role("button", name="Run").or_(page.get_by_role("button", name="Go")).click()
    page.wait_for_selector(".messagelist .success")
    assert "Paused: emails" in page.locator(".messagelist").inner_text()
    assert "paused since" in row.inner_text()
    assert Queue.objects.get(name="emails").is_paused
    assert not Queue.objects.get(name="default").is_paused

    # The job list's overview says so too.
    page.goto(f"{live_server.url}/admin/django_eddyq/job/")
    overview_row = page.locator(".eddyq-overview-queues tr", has_text="emails")
    assert "paused since" in overview_row.inner_text()


def test_workers_page(page: Any, live_server: Any) -> None:
    """The fleet: a live worker that leads, a lost one and a stopped one; a job that the lost
    one ran last, whose page links to it."""
    for worker_id, seen, stopped, leader in (
        ("web-1:4242:9f2c", timedelta(seconds=1), False, True),
        ("web-2:77:a1b2", timedelta(minutes=7), False, False),
        ("web-3:15:c3d4", timedelta(minutes=3), True, False),
    ):
        host, pid, _token = worker_id.split(":")
        WorkerProcess.objects.create(
            id=worker_id,
            host=host,
            pid=int(pid),
            version="0.1.0",
            queues=None if leader else ["emails"],
            concurrency=10,
            running=2 if not stopped else 0,
            leader=leader,
        )
        WorkerProcess.objects.filter(pk=worker_id).update(
            last_seen_at=Now() - seen, stopped_at=Now() - seen if stopped else None
        )
    job = JobFactory(
        state=Job.State.FAILED,
        attempt=1,
        attempted_by="web-2:77:a1b2",
        finalized_at=timezone.now(),
        errors=[{"attempt": 1, "error": "ValueError: boom", "worker": "web-2:77:a1b2"}],
    )

    page.goto(f"{live_server.url}/admin/django_eddyq/workerprocess/")
    assert "is lost" in page.locator("#eddyq-workers-note").inner_text()
    statuses = page.locator("#result_list tbody td.field-status_badge").all_inner_texts()
    assert statuses == ["running", "lost", "stopped"]
    assert page.locator(".eddyq-worker-lost").is_visible()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "admin-workers.png"), full_page=True)

    # The lost ones, from the filter sidebar.
    page.locator("#changelist-filter").get_by_role("link", name="lost", exact=True).click()
    page.wait_for_url("**status=lost**")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "(7m" in page.locator("#result_list tbody td.field-last_seen").inner_text()

    # From a job's page to the worker of its attempt.
    page.goto(f"{live_server.url}/admin/django_eddyq/job/{job.pk}/change/")
    page.locator(".fieldBox.field-worker_display").get_by_role("link", name="web-2:77:a1b2").click()
    page.wait_for_url("**/workerprocess/**/change/**")
    assert "lost" in page.locator(".field-status_badge").inner_text()
    assert "emails" in page.locator(".fieldBox.field-queues_display").inner_text()


@override_settings(
    EDDYQ={
        "PERIODIC": {
            "nightly-report": {"task": tasks.record.path, "cron": "0 2 * * *", "args": ["x"]},
            "paris-digest": {
                "task": tasks.send_email.path,
                "cron": "0 8 * * 1-5",
                "timezone": "Europe/Paris",
                "args": ["team@example.com"],
            },
        }
    }
)
def test_periodic_schedules_page(page: Any, live_server: Any) -> None:
    """See the schedules, disable one, run it now, and go to the jobs of its runs."""
    last = JobFactory(task=tasks.record.path, metadata={"periodic": "nightly-report"})
    PeriodicSchedule.objects.create(
        name="nightly-report",
        last_run_at=timezone.now().replace(hour=2, minute=0, second=0, microsecond=0),
        last_job_id=last.pk,
    )
    page.goto(f"{live_server.url}/admin/")
    page.get_by_role("link", name="Periodic schedules").click()
    page.wait_for_url("**/periodicschedule/")
    names = page.locator("#result_list tbody th.field-name").all_inner_texts()
    assert names == ["nightly-report", "paris-digest"]  # the digest never ran: no row yet
    row = page.locator("#result_list tbody tr", has_text="nightly-report")
    assert "0 2 * * *" in row.inner_text() and "enabled" in row.inner_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "admin-periodic.png"), full_page=True)

    row.get_by_role("button", name="Disable").click()
    page.wait_for_selector(".messagelist .success")
    assert "Disabled: nightly-report." in page.locator(".messagelist").inner_text()
    assert "disabled" in row.locator("td.field-enabled").inner_text()
    assert PeriodicSchedule.objects.get(name="nightly-report").enabled is False

    row.get_by_role("button", name="Run now").click()
    page.wait_for_selector(".messagelist .success")
    manual = Job.objects.exclude(pk=last.pk).get()
    assert manual.metadata == {"periodic": "nightly-report", "manual": True}
    page.locator(".messagelist").get_by_role("link", name=f"job {manual.pk}").click()
    page.wait_for_url(f"**/job/{manual.pk}/change/")

    # Back on the list, the last run links to its job.
    page.go_back()
    row.locator("td.field-last_run").get_by_role("link", name=f"job {last.pk}").click()
    page.wait_for_url(f"**/job/{last.pk}/change/")
    assert "tests.jobs.record" in page.locator("#content").inner_text()


def test_retry_all_matching_past_the_selection_limit(page: Any, live_server: Any) -> None:
    """1,500 failed jobs, more than an action on selected rows takes: "Retry all matching"
    from the filtered list, a confirmation with the count and the filter, and every one of
    them retried, in batches that continue by themselves from request to request."""
    from django.contrib import admin

    from django_eddyq.admin import ACTION_LIMIT

    failed = JobFactory.create_batch(ACTION_LIMIT + 500, failed=True, queue="emails")
    JobFactory(failed=True, queue="reports")
    job_admin = admin.site.get_model_admin(Job)
    job_admin.bulk_batch_size = 400  # several batches, and with no time, several requests
    job_admin.bulk_seconds = 0.0
    try:
        page.goto(f"{live_server.url}/admin/django_eddyq/job/?state__exact=failed&queue=emails")
        page.get_by_role("link", name="Retry all matching").click()
        page.wait_for_url("**/job/bulk/retry/**")
        assert f"{len(failed):,} jobs match." in page.locator("#content").inner_text()
        assert "jobs in state failed, of queue emails" in page.locator("#content").inner_text()
        page.get_by_role("button", name="Yes, Retry all matching").click()
        page.wait_for_selector(".messagelist .success", timeout=60_000)
    finally:
        del job_admin.bulk_batch_size, job_admin.bulk_seconds
    assert (
        f"Retried {len(failed):,} of {len(failed):,} matching jobs"
        in page.locator(".messagelist").inner_text()
    )
    assert Job.objects.filter(queue="emails", state="available").count() == len(failed)
    assert Job.objects.get(queue="reports").state == "failed"


def test_activity_charts(page: Any, live_server: Any) -> None:
    """From the job list's overview to the activity page: its charts drawn, their legends in
    words, their numbers in a table."""
    from django_eddyq.maintenance.activity import ActivitySampler
    from django_eddyq.models import Activity

    QueueFactory(name="default")
    JobFactory.create_batch(3, queue="default")
    now = timezone.now().replace(second=0, microsecond=0)
    for minutes in range(60):
        Activity.objects.create(
            minute=now - timedelta(minutes=minutes),
            queue="default",
            source="w1",
            completed=20 + (minutes * 7) % 17,
            failed=(minutes * 3) % 5,
            retried=(minutes * 5) % 7,
        )
        Activity.objects.create(
            minute=now - timedelta(minutes=minutes),
            queue="default",
            source="sampler",
            available=100 - minutes + minutes % 4 * 5,
        )
    for hours in range(2, 168):
        Activity.objects.create(
            minute=now.replace(minute=0) - timedelta(hours=hours),
            queue="default",
            source="hour",
            completed=600 + 20 * (hours * 5 % 9) + (200 if hours % 24 < 8 else 0),
            failed=hours * 3 % 4 * 10,
            retried=hours * 5 % 6 * 8,
            available=50 + hours % 24 * 3,
        )
    ActivitySampler().run_once()
    page.goto(f"{live_server.url}/admin/django_eddyq/job/")
    page.click("#eddyq-activity-link")
    chart = page.locator("svg#eddyq-activity-hour-finished")
    chart.wait_for(state="visible")
    assert chart.get_attribute("role") == "img"
    assert "Jobs finished, the last hour, per minute" in chart.locator("title").text_content()
    legend = chart.locator(".eddyq-chart-legend").text_content()
    assert "completed" in legend and "failed" in legend and "retried" in legend
    assert page.locator("svg#eddyq-activity-week-depth").is_visible()
    page.click("text=The numbers, as a table")
    assert page.locator(".eddyq-chart-data table").first.is_visible()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "admin-activity.png"), full_page=True)


def test_set_a_queues_limits(page: Any, live_server: Any, jobs: dict[str, Job]) -> None:
    """Open a queue from the list, limit it, save, and read the limits in the list."""
    page.goto(f"{live_server.url}/admin/django_eddyq/queue/")
    page.locator("#result_list tbody th a", has_text="emails").click()
    page.wait_for_url("**/queue/emails/change/")
    page.fill("input[name=concurrency]", "2")
    page.fill("input[name=rate]", "10/s")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "admin-queue-limits.png"), full_page=True)
    page.get_by_role("button", name="Save", exact=True).click()
    page.wait_for_selector(".messagelist .success")
    row = page.locator("#result_list tbody tr", has_text="emails")
    assert row.locator("td.field-limits_display").inner_text() == "≤ 2 running · 10/s (burst 10)"
    other = page.locator("#result_list tbody tr", has_text="reports")
    assert other.locator("td.field-limits_display").inner_text() == "—"
    page.screenshot(path=str(SCREENSHOTS / "admin-queues.png"), full_page=True)
    queue = Queue.objects.get(name="emails")
    assert (queue.concurrency, queue.rate_limit, queue.rate_period) == (2, 10, 1.0)

    # A value that is not a limit: the form says so, and nothing changes.
    row.locator("th a").click()
    page.fill("input[name=rate]", "10 per second")
    page.get_by_role("button", name="Save", exact=True).click()
    page.wait_for_selector(".errorlist")
    assert "is invalid" in page.locator(".form-row.field-rate .errorlist").inner_text()
    assert Queue.objects.get(name="emails").rate_limit == 10


def test_retry_a_failed_workflow_from_its_page(page: Any, live_server: Any) -> None:
    """A workflow whose middle step failed: its graph and steps drawn, the failed step retried
    by the page's button, and the step it had cancelled back, waiting for it."""
    workflow = Workflow("nightly import")
    fetch = workflow.add(tasks.workflow_step.s("fetch"), name="fetch")
    load = workflow.add(
        tasks.workflow_step.using(max_attempts=1).s("load", fail=True), after=[fetch], name="load"
    )
    workflow.add(tasks.workflow_step.s("report"), after=[load], name="report")
    workflow.enqueue()
    for _ in range(3):
        run_jobs()

    def states() -> dict[str, str]:
        rows = page.locator(".field-steps_table tbody tr")
        return {
            rows.nth(n).locator("td").nth(0).inner_text(): rows.nth(n)
            .locator("td")
            .nth(1)
            .inner_text()
            for n in range(rows.count())
        }

    page.goto(f"{live_server.url}/admin/django_eddyq/workflowrun/")
    page.locator("#result_list").get_by_role("link", name=str(workflow.id), exact=True).click()
    page.wait_for_url(f"**/workflowrun/{workflow.id}/change/")
    graph = page.locator("svg.eddyq-graph")
    assert graph.is_visible()
    assert graph.locator("rect").count() == 3 and graph.locator("line").count() == 2
    assert graph.locator(".eddyq-state-failed title").text_content() == "load: failed"
    assert states() == {"fetch": "completed", "load": "failed", "report": "cancelled"}
    assert page.get_by_role("button", name="Cancel workflow").count() == 0
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "admin-workflow.png"), full_page=True)

    Job.objects.filter(pk=load.job_id).update(kwargs={"fail": False})  # the warehouse is back
    page.get_by_role("button", name="Retry failed steps").click()
    page.wait_for_selector(".messagelist .success")
    assert "Workflow nightly import: 1 step retried." in page.locator(".messagelist").inner_text()
    assert states() == {"fetch": "completed", "load": "available", "report": "pending"}
    assert page.get_by_role("button", name="Cancel workflow").is_visible()

    run_jobs()
    run_jobs()
    page.reload()
    assert states() == {"fetch": "completed", "load": "completed", "report": "completed"}
    assert page.locator(".fieldBox.field-state_badge .eddyq-state-completed").is_visible()
