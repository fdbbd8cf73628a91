"""Prometheus metrics: counters and histograms of what workers run, gauges read from the
database, ``/metrics`` served by real worker processes (one, and several combined), the Django
view, and nothing of prometheus_client imported or paid for while metrics are off."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings
from django.urls import path
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from demo.models import Execution
from django_eddyq import checks, metrics, pause_queue
from django_eddyq.models import Job, WorkerProcess
from django_eddyq.worker import Worker
from tests import jobs
from tests.processes import MANAGE, StartWorker, children_of, wait_for

urlpatterns = [path("metrics", metrics.metrics_view)]

type Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def exposed() -> Samples:
    """What ``/metrics`` would show in this process now."""
    from prometheus_client import generate_latest

    return parse(generate_latest(metrics.registry()).decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def counting() -> Iterator[None]:
    """Metrics on in this process, as EDDYQ["METRICS"] turns them on; off again after."""
    metrics.enable()
    yield
    metrics.disable()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return parse(response.read().decode())


def scraped_when(port: int, condition: Callable[[Samples], bool], seconds: float = 60) -> Samples:
    """Scrapes until ``condition`` holds of what ``/metrics`` shows (it may not be up yet)."""
    seen: dict[str, Samples] = {}

    def holds() -> bool:
        try:
            seen["samples"] = scrape(port)
        except OSError:
            return False
        return condition(seen["samples"])

    wait_for(holds, seconds)
    return seen["samples"]


# Counted in the process.


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_counts_each_outcome_and_times_runs_and_waits(
    counting: None, run_burst_worker: Callable[..., Worker]
) -> None:
    before = exposed()
    jobs.add.enqueue(1, 2)
    jobs.add.enqueue(3, 4)
    jobs.discard.enqueue("no")
    jobs.always_fails.enqueue("again")
    jobs.snooze.enqueue(60)
    jobs.echo.using(queue="late", run_at=timezone.now() - timedelta(seconds=100)).enqueue()
    run_burst_worker()
    after = exposed()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    add, queue = jobs.add.path, "default"
    assert delta("eddyq_jobs_enqueued_total", task=add, queue=queue) == 2
    assert delta("eddyq_jobs_enqueued_total", task=jobs.echo.path, queue="late") == 1
    for task, outcome in [
        (add, "completed"),
        (jobs.discard.path, "discarded"),
        (jobs.always_fails.path, "retried"),
        (jobs.snooze.path, "snoozed"),
        (jobs.echo.path, "completed"),
    ]:
        expected = 2 if task == add else 1
        labels = {"task": task, "queue": "late" if task == jobs.echo.path else queue}
        assert delta("eddyq_jobs_finished_total", **labels, outcome=outcome) == expected, task
    assert delta("eddyq_jobs_finished_total", task=add, queue=queue, outcome="failed") == 0

    assert delta("eddyq_job_run_seconds_count", task=add, queue=queue) == 2
    assert 0 < delta("eddyq_job_run_seconds_sum", task=add, queue=queue) < 5
    assert delta("eddyq_job_run_seconds_bucket", task=add, queue=queue, le="+Inf") == 2
    # The job due 100 s ago waited between 60 s and 300 s: in the 300 s bucket, not the 60 s one.
    late = {"task": jobs.echo.path, "queue": "late"}
    assert delta("eddyq_job_wait_seconds_bucket", **late, le="60.0") == 0
    assert delta("eddyq_job_wait_seconds_bucket", **late, le="300.0") == 1
    assert 100 <= delta("eddyq_job_wait_seconds_sum", **late) < 300
    assert delta("eddyq_job_wait_seconds_count", task=add, queue=queue) == 2


@pytest.mark.django_db(transaction=True)
def test_labels_come_from_rows_as_they_are_and_never_break_the_exposition(
    counting: None, run_burst_worker: Callable[..., Worker]
) -> None:
    # Any producer may write any task path: it fails at once, and is counted under its name.
    weird = 'no.such.task"\n{le="1"} \\ é'
    Job.objects.create(task=weird, args=[], kwargs={}, queue="default", max_attempts=1)
    run_burst_worker()
    labels = {"task": weird, "queue": "default", "outcome": "failed"}
    assert value(exposed(), "eddyq_jobs_finished_total", **labels) == 1


def test_waits_that_are_not_finite_are_left_out_and_negative_ones_count_as_zero(
    counting: None,
) -> None:
    labels = {"task": "tests.metrics.clock", "queue": "clock"}
    before = exposed()
    for due in (float("-inf"), float("inf"), float("nan"), time.time() + 30):
        job = SimpleNamespace(task=labels["task"], queue=labels["queue"], due=due)
        metrics.job_started(job)  # type: ignore[arg-type]
    job = SimpleNamespace(task=labels["task"], queue=labels["queue"], due=0.0)
    metrics.job_finished(job, "handed back", None)  # type: ignore[arg-type]
    metrics.job_finished(job, "completed", math.inf)  # type: ignore[arg-type]
    after = exposed()
    # Only the job due in the future (a clock behind the database's) is observed, at zero.
    assert value(after, "eddyq_job_wait_seconds_count", **labels) == 1
    assert value(after, "eddyq_job_wait_seconds_sum", **labels) == 0
    assert value(before, "eddyq_job_wait_seconds_count", **labels) == 0
    assert value(after, "eddyq_jobs_finished_total", **labels, outcome="handed back") == 1
    assert value(after, "eddyq_job_run_seconds_count", **labels) == 0


def test_an_enqueue_of_many_jobs_is_counted_per_task_and_queue(counting: None) -> None:
    rows = [SimpleNamespace(task="t.a", queue="q1")] * 3 + [SimpleNamespace(task="t.b", queue="q1")]
    before = exposed()
    metrics._enqueued(Job, jobs=rows)
    after = exposed()
    for task, count in [("t.a", 3), ("t.b", 1)]:
        labels = {"task": task, "queue": "q1"}
        assert (
            value(after, "eddyq_jobs_enqueued_total", **labels)
            - value(before, "eddyq_jobs_enqueued_total", **labels)
            == count
        )


# Read from the database.


def _job(queue: str, state: str, **fields: Any) -> Job:
    fields.setdefault("run_at", timezone.now())
    if state in ("completed", "failed", "cancelled"):
        fields.setdefault("finalized_at", timezone.now())
    if state == "running":
        fields.setdefault("locked_by", "elsewhere:1:abc")
        fields.setdefault("locked_until", timezone.now() + timedelta(minutes=1))
    return Job.objects.create(
        task=jobs.add.path, args=[1, 2], kwargs={}, queue=queue, state=state, **fields
    )


@pytest.mark.django_db(transaction=True)
def test_gauges_count_jobs_per_queue_and_state_and_the_oldest_due_job_s_wait() -> None:
    now = timezone.now()
    jobs.add.using(queue="mail").enqueue(1, 1)  # creates the queue row
    _job("mail", "available", run_at=now - timedelta(seconds=120), priority=-5)
    _job("mail", "available", run_at=now - timedelta(seconds=10), priority=5)
    for state, count in [
        ("pending", 2),
        ("running", 2),
        ("scheduled", 3),
        ("retryable", 1),
        ("completed", 4),
    ]:
        for _ in range(count):
            _job("mail", state, run_at=now + timedelta(hours=1))
    _job("reports", "failed")
    _job("reports", "cancelled")
    pause_queue("idle")

    gauges = metrics.read_gauges()
    assert gauges.ok and gauges.error is None
    assert 0 < gauges.seconds < 5
    assert {state: gauges.jobs["mail", state] for state in Job.State.values} == {
        "pending": 2,
        "scheduled": 3,
        "available": 3,
        "running": 2,
        "retryable": 1,
        "completed": 4,
        "failed": 0,
        "cancelled": 0,
    }
    assert gauges.jobs["reports", "failed"] == gauges.jobs["reports", "cancelled"] == 1
    assert all(gauges.jobs["idle", state] == 0 for state in Job.State.values)
    # The oldest due available job of mail, though behind a job of higher priority.
    assert 120 <= gauges.latency["mail"] < 180
    assert gauges.latency["idle"] == 0
    assert gauges.paused == {"idle": True, "mail": False, "reports": False}

    samples = exposed()
    assert value(samples, "eddyq_jobs", queue="mail", state="running") == 2
    assert value(samples, "eddyq_queue_latency_seconds", queue="mail") >= 120
    assert value(samples, "eddyq_queue_paused", queue="idle") == 1
    assert value(samples, "eddyq_database_up") == 1


def test_counts_past_their_bounds_become_estimates() -> None:
    limit, sample = metrics.COUNT_LIMIT, metrics.TERMINAL_SAMPLE
    rows = [
        ("queue", "big", None, 0, None),
        ("queue", "small", None, 0, None),
        ("available", "big", "available", limit + 1, None),
        ("available", "small", "available", 40, None),
        # The latest finalized completed jobs: three quarters of big's, then the bound is hit.
        ("sampled", "big", "completed", 751, None),
        ("sampled", "small", "completed", 250, None),
        ("sampled", "small", "failed", 7, None),
        ("estimate", None, "available", 50_040, None),
        ("estimate", None, "completed", 1_000_000, None),
        ("estimate", None, "failed", 3, None),
    ]
    gauges = metrics.gauges_from_rows(rows)
    assert gauges.jobs["small", "available"] == 40
    assert gauges.jobs["big", "available"] == 50_000  # the estimate less the exact counts
    assert gauges.jobs["big", "completed"] == round(751 * 1_000_000 / (sample + 1))
    assert gauges.jobs["small", "completed"] == round(250 * 1_000_000 / (sample + 1))
    assert gauges.jobs["small", "failed"] == 7  # exact: fewer than the bound, whatever estimated
    # Past the bound with an estimate too low to believe: never below what was counted.
    low = metrics.gauges_from_rows(
        [("available", "a", "available", limit + 1, None), ("estimate", None, "available", 5, None)]
    )
    assert low.jobs["a", "available"] == limit + 1


@pytest.mark.django_db(transaction=True)
def test_a_scrape_never_waits_long_for_a_locked_table() -> None:
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        dbname=settings["NAME"],
    ) as locker:
        locker.execute("LOCK TABLE eddyq_jobs IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        gauges = metrics.read_gauges(timeout=0.5)
        assert time.monotonic() - started < 3
        locker.rollback()
    assert not gauges.ok
    assert gauges.error is not None and "statement timeout" in gauges.error


def test_an_unreachable_database_still_answers_with_the_counters(
    counting: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_eddyq import db

    real = db.connection_params

    def unreachable(alias: str | None = None) -> dict[str, Any]:
        return {**real(alias), "host": "127.0.0.1", "port": free_port()}

    monkeypatch.setattr(db, "connection_params", unreachable)
    metrics._enqueued(Job, jobs=[SimpleNamespace(task="t.down", queue="q")])
    samples = exposed()
    assert value(samples, "eddyq_database_up") == 0
    assert value(samples, "eddyq_jobs_enqueued_total", task="t.down", queue="q") >= 1
    assert not any(name == "eddyq_jobs" for name, _ in samples)


# Exposed.


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
def test_the_django_view_serves_the_gauges_and_this_process_s_counters(counting: None) -> None:
    jobs.add.using(queue="viewed").enqueue(1, 2)
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert "no-cache" in response["Cache-Control"]
    samples = parse(response.content.decode())
    assert value(samples, "eddyq_jobs", queue="viewed", state="available") == 1
    assert value(samples, "eddyq_jobs_enqueued_total", task=jobs.add.path, queue="viewed") >= 1
    assert value(samples, "eddyq_database_up") == 1
    openmetrics = Client().get("/metrics", HTTP_ACCEPT="application/openmetrics-text")
    assert openmetrics["Content-Type"].startswith("application/openmetrics-text")
    assert openmetrics.content.decode().endswith("# EOF\n")


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
def test_metrics_scraped_over_http_from_a_running_worker(start_worker: StartWorker) -> None:
    port = free_port()
    worker = start_worker("--concurrency", "2", "--metrics-port", str(port))
    scraped_when(port, lambda samples: value(samples, "eddyq_database_up") == 1)
    jobs.add.enqueue(2, 2)
    jobs.discard.enqueue("no")
    labels = {"task": jobs.add.path, "queue": "default"}
    discarded = {"task": jobs.discard.path, "queue": "default", "outcome": "discarded"}
    samples = scraped_when(
        port,
        lambda samples: (
            value(samples, "eddyq_jobs_finished_total", **labels, outcome="completed") == 1
            and value(samples, "eddyq_jobs_finished_total", **discarded) == 1
        ),
    )
    assert value(samples, "eddyq_job_run_seconds_count", **labels) == 1
    assert value(samples, "eddyq_job_wait_seconds_count", **labels) == 1
    wait_for(lambda: not Job.objects.filter(state="available").exists())
    samples = scrape(port)
    assert value(samples, "eddyq_jobs", queue="default", state="completed") == 1
    assert value(samples, "eddyq_jobs", queue="default", state="failed") == 1
    assert worker.poll() is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.processes
def test_the_counters_of_every_worker_process_are_combined(start_worker: StartWorker) -> None:
    port = free_port()
    supervisor = start_worker("--processes", "2", "--concurrency", "2", "--metrics-port", str(port))
    scraped_when(port, lambda samples: value(samples, "eddyq_database_up") == 1)
    wait_for(lambda: WorkerProcess.objects.filter(stopped_at__isnull=True).count() == 2, 60)
    jobs.sleep.enqueue_many([(0.05, f"job-{n}") for n in range(60)])
    labels = {"task": jobs.sleep.path, "queue": "default"}
    samples = scraped_when(
        port,
        lambda samples: (
            value(samples, "eddyq_jobs_finished_total", **labels, outcome="completed") == 60
        ),
    )
    # Both children ran some of them, and /metrics counts every one once.
    assert Execution.objects.values("pid").distinct().count() == 2
    assert value(samples, "eddyq_job_run_seconds_count", **labels) == 60
    assert value(samples, "eddyq_jobs_enqueued_total", **labels) == 0  # enqueued here, not there
    # Each child keeps its values in files of its own, in a directory the supervisor made.
    children = children_of(supervisor.pid)
    assert len(children) == 2
    directories = [
        directory
        for directory in Path(tempfile.gettempdir()).glob("eddyq-metrics-*")
        if all((directory / f"counter_{child}.db").exists() for child in children)
    ]
    assert len(directories) == 1

    supervisor.terminate()
    assert supervisor.wait(30) == 0
    assert not directories[0].exists()  # removed as the supervisor exited


# Off, or not installed.


def _python(code: str, **environment: str) -> subprocess.CompletedProcess[str]:
    settings = connection.settings_dict
    url = (
        f"postgres://{settings['USER']}:{settings['PASSWORD'] or ''}@{settings['HOST']}:"
        f"{settings['PORT']}/{settings['NAME']}"
    )
    env = {key: item for key, item in os.environ.items() if not key.startswith("EDDYQ_")} | {
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "PYTHONPATH": os.pathsep.join([str(MANAGE.parent.parent), str(MANAGE.parent)]),
        "DATABASE_URL": url,
        "EDDYQ_TASK_MODULES": "tests.jobs",
        **environment,
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


WORKER_AND_CHECKS = """
import sys
import django
django.setup()
import django_eddyq
from django.core.management import call_command
call_command("check")
call_command("eddyq_worker", "--burst", "--no-maintenance", verbosity=0)
print("prometheus_client" in sys.modules)
"""


@pytest.mark.django_db(transaction=True)
def test_with_metrics_off_nothing_of_prometheus_client_is_imported() -> None:
    off = _python(WORKER_AND_CHECKS)
    assert off.returncode == 0, off.stderr
    assert off.stdout.split()[-1] == "False"
    on = _python(WORKER_AND_CHECKS, EDDYQ_METRICS="true")
    assert on.returncode == 0, on.stderr
    assert on.stdout.split()[-1] == "True"


@pytest.mark.django_db
def test_without_prometheus_client_asking_for_metrics_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    assert not metrics.installed()
    with override_settings(EDDYQ={"METRICS": True}):
        errors = checks.check_metrics_installed()
        assert [error.id for error in errors] == [checks.METRICS_NOT_INSTALLED]
        assert errors[0].hint == 'pip install "django-eddyq[prometheus]"'
        assert not metrics.enable_if_configured()
    assert checks.check_metrics_installed() == []
    with pytest.raises(CommandError, match=r'pip install "django-eddyq\[prometheus\]"'):
        call_command("eddyq_worker", "--burst", "--metrics-port", "0", verbosity=0)
    with pytest.raises(ImproperlyConfigured, match="prometheus-client"):
        metrics.registry()
