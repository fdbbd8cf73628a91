"""OpenTelemetry traces: a producer span per enqueue call, a consumer span per attempt, one trace
from the request that enqueued a job to the job's attempt in a worker process; nothing at all
when OpenTelemetry is not set up (docs/observability.md, "Tracing")."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync

pytest.importorskip("opentelemetry.sdk")

from django.test import Client, override_settings
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import django_eddyq
from django_eddyq import task, tracing
from django_eddyq.enqueue import COPY_THRESHOLD, JobSpec, insert_jobs
from django_eddyq.maintenance import PeriodicEnqueuer
from django_eddyq.models import Batch, Job
from django_eddyq.worker import Worker
from tests.processes import StartWorker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parent.parent
EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
# The tests' own spans: the request's, and the handlers' instrumented calls.
TRACER = PROVIDER.get_tracer("tests")

RunWorker = Callable[..., Worker]


@pytest.fixture(autouse=True)
def traced() -> Iterator[None]:
    """eddyq traces with the tests' provider; the global one stays unset for other tests."""
    EXPORTER.clear()
    tracing.use_tracer_provider(PROVIDER)
    yield
    tracing.use_tracer_provider(None)


@task
def add(a: int, b: int) -> int:
    with TRACER.start_as_current_span("handler work"):
        return a + b


@task
async def async_add(a: int, b: int) -> int:
    with TRACER.start_as_current_span("async handler work"):
        await asyncio.sleep(0)
        return a + b


@task(max_attempts=1)
def fails(message: str) -> None:
    raise ValueError(message)


@task(timeout="200ms", max_attempts=1)
def overruns(seconds: float) -> None:
    time.sleep(seconds)


@task
def report(*, batch_id: int, counts: dict[str, int]) -> int:
    return counts["completed"]


def spans(kind: SpanKind | None = None, name: str | None = None) -> list[ReadableSpan]:
    return [
        span
        for span in EXPORTER.get_finished_spans()
        if (kind is None or span.kind == kind) and (name is None or span.name == name)
    ]


def attempt_span(job: Job) -> ReadableSpan:
    [span] = [
        span
        for span in spans(SpanKind.CONSUMER)
        if span.attributes and span.attributes["messaging.message.id"] == str(job.pk)
    ]
    return span


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


# Enqueueing.


def test_an_enqueue_is_a_producer_span_whose_context_the_job_keeps() -> None:
    with TRACER.start_as_current_span("request") as request:
        job = add.enqueue(2, 3)

    [producer] = spans(SpanKind.PRODUCER)
    assert producer.name == "send default"
    assert parent_id(producer) == request.get_span_context().span_id
    assert dict(producer.attributes or {}) == {
        "messaging.system": "django-eddyq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.pk),
        "eddyq.task": add.path,
    }
    trace_id, span_id = ids(producer)
    stored = Job.objects.get(pk=job.pk).metadata
    assert stored == job.metadata
    assert stored["otel"]["traceparent"].startswith(f"00-{trace_id:032x}-{span_id:016x}-")


@pytest.mark.parametrize("count", [3, COPY_THRESHOLD])
def test_enqueue_many_is_one_producer_span(count: int) -> None:
    jobs = add.using(queue="bulk").enqueue_many([(n, n) for n in range(count)])

    [producer] = spans(SpanKind.PRODUCER)
    assert producer.name == "send bulk"
    assert producer.parent is None  # nothing was current: it starts the trace
    assert producer.attributes is not None
    assert producer.attributes["messaging.batch.message_count"] == count
    assert "messaging.message.id" not in producer.attributes
    trace_id, span_id = ids(producer)
    traceparents = {
        job["otel"]["traceparent"] for job in Job.objects.values_list("metadata", flat=True)
    }
    [traceparent] = traceparents
    assert traceparent.startswith(f"00-{trace_id:032x}-{span_id:016x}-")
    assert jobs[-1].metadata["otel"]["traceparent"] in traceparents


def test_an_async_enqueue_is_a_child_of_the_async_caller_span() -> None:
    async def view() -> tuple[int, Job, list[Job]]:
        with TRACER.start_as_current_span("async request") as request:
            one = await add.aenqueue(1, 2)
            many = await add.aenqueue_many([(1, 1)] * COPY_THRESHOLD)
        return request.get_span_context().span_id, one, many

    request_id, one, many = async_to_sync(view)()
    producers = spans(SpanKind.PRODUCER)
    assert [parent_id(span) for span in producers] == [request_id, request_id]
    assert "otel" in one.metadata and "otel" in many[0].metadata


def test_a_failed_enqueue_ends_its_span_in_error() -> None:
    spec = JobSpec.for_task(add, (1, 2), {})
    spec.metadata["bad"] = object()  # not JSON
    with pytest.raises(TypeError):
        insert_jobs([spec])
    [producer] = spans(SpanKind.PRODUCER)
    assert producer.status.status_code == StatusCode.ERROR
    assert [event.name for event in producer.events] == ["exception"]


def test_without_a_tracer_provider_nothing_is_traced_or_stored(
    run_burst_worker: RunWorker,
) -> None:
    tracing.use_tracer_provider(None)  # and no global provider: OpenTelemetry's API is a no-op
    with TRACER.start_as_current_span("request"):
        job = add.enqueue(2, 3)
        many = add.enqueue_many([(1, 1)] * COPY_THRESHOLD)
    run_burst_worker()
    # Only the tests' own spans: none of eddyq's.
    assert {span.name for span in spans()} == {"request", "handler work"}
    assert Job.objects.get(pk=job.pk).metadata == {} == many[0].metadata


# Attempts.


@pytest.mark.parametrize("traced_task", [add, async_add], ids=["sync", "async"])
def test_an_attempt_continues_the_trace_of_its_enqueue(
    run_burst_worker: RunWorker, traced_task: Any
) -> None:
    with TRACER.start_as_current_span("request") as request:
        job = traced_task.enqueue(2, 3)
    worker = run_burst_worker()

    [producer] = spans(SpanKind.PRODUCER)
    consumer = attempt_span(job)
    assert consumer.name == "process default"
    assert consumer.context is not None
    assert consumer.context.trace_id == request.get_span_context().trace_id
    assert parent_id(consumer) == producer.context.span_id  # type: ignore[union-attr]
    assert dict(consumer.attributes or {}) == {
        "messaging.system": "django-eddyq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.pk),
        "messaging.client.id": worker.id,
        "eddyq.task": traced_task.path,
        "eddyq.attempt": 1,
        "eddyq.outcome": "completed",
    }
    assert consumer.status.status_code == StatusCode.UNSET
    # The handler's own spans are the attempt's children.
    [work] = [span for span in spans() if span.name.endswith("handler work")]
    assert parent_id(work) == consumer.context.span_id


def test_an_attempt_leaves_no_context_behind_on_its_thread(run_burst_worker: RunWorker) -> None:
    with TRACER.start_as_current_span("request"):
        traced = add.enqueue(1, 2)
    tracing.use_tracer_provider(None)
    untraced = add.enqueue(3, 4)  # no context stored
    tracing.use_tracer_provider(PROVIDER)
    run_burst_worker(concurrency=1)  # one handler thread runs both, in turn
    assert attempt_span(traced).parent is not None
    assert attempt_span(untraced).parent is None


def test_a_failure_is_recorded_on_the_attempt_span(run_burst_worker: RunWorker) -> None:
    failed = fails.enqueue("no such user")
    retried = fails.using(max_attempts=2).enqueue("try again")
    run_burst_worker()

    for job, outcome in [(failed, "failed"), (retried, "retried")]:
        span = attempt_span(job)
        assert span.attributes is not None
        assert span.attributes["eddyq.outcome"] == outcome
        assert span.attributes["error.type"] == "builtins.ValueError"
        assert span.status.status_code == StatusCode.ERROR
        assert span.status.description == f"ValueError: {job.args[0]}"
        [event] = span.events
        assert event.name == "exception"
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == job.args[0]


def test_a_timed_out_attempt_ends_its_span_when_the_handler_returns(
    run_burst_worker: RunWorker,
) -> None:
    job = overruns.enqueue(0.6)
    run_burst_worker()
    wait_for(lambda: bool(spans(SpanKind.CONSUMER)), seconds=5)  # the handler overran
    span = attempt_span(job)
    assert span.attributes is not None
    assert span.attributes["eddyq.outcome"] == "failed"
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == (
        f"TimeoutError: task {overruns.path} ran longer than its timeout of 0.2s"
    )


def test_an_unknown_task_still_has_its_attempt_span(run_burst_worker: RunWorker) -> None:
    spec = JobSpec.for_task(add, (), {})
    spec.task = "tests.test_tracing.no_such_task"
    [job] = insert_jobs([spec])
    run_burst_worker()
    span = attempt_span(job)
    assert parent_id(span) == spans(SpanKind.PRODUCER)[0].context.span_id  # type: ignore[union-attr]
    assert span.attributes is not None
    assert span.attributes["eddyq.outcome"] == "retried"
    assert span.attributes["error.type"] == "django_eddyq.exceptions.TaskNotFound"


def test_a_context_that_cannot_be_read_starts_a_trace(run_burst_worker: RunWorker) -> None:
    spec = JobSpec.for_task(add, (1, 2), {})
    tracing.use_tracer_provider(None)
    [unreadable, garbled] = insert_jobs([spec, JobSpec.for_task(add, (3, 4), {})])
    Job.objects.filter(pk=unreadable.pk).update(metadata={"otel": ["00-abc"]})
    Job.objects.filter(pk=garbled.pk).update(metadata={"otel": {"traceparent": 42}})
    tracing.use_tracer_provider(PROVIDER)
    run_burst_worker()
    for job in (unreadable, garbled):
        span = attempt_span(job)
        assert span.parent is None
        assert span.attributes is not None
        assert span.attributes["eddyq.outcome"] == "completed"


# Traces of their own: batch callbacks and periodic runs.


def test_a_batch_callback_starts_a_trace_of_its_own(run_burst_worker: RunWorker) -> None:
    with (
        TRACER.start_as_current_span("request") as request,
        django_eddyq.batch(on_complete=report) as batch,
    ):
        add.enqueue(1, 1)
    run_burst_worker()

    callback = Job.objects.get(pk=Batch.objects.get(pk=batch.pk).callback_job)
    request_trace = request.get_span_context().trace_id
    [producer] = [
        span for span in spans(SpanKind.PRODUCER) if span.attributes["eddyq.task"] == report.path
    ]
    # Enqueued by the worker's pass, in no span: a root, linked to nothing.
    assert producer.parent is None
    assert producer.links == ()
    consumer = attempt_span(callback)
    assert consumer.context.trace_id == producer.context.trace_id != request_trace  # type: ignore[union-attr]
    assert parent_id(consumer) == producer.context.span_id  # type: ignore[union-attr]


def test_a_callback_enqueued_in_a_span_is_a_root_linked_to_it() -> None:
    with TRACER.start_as_current_span("request") as request, django_eddyq.batch(report) as batch:
        pass  # an empty batch completes as its block ends, here

    callback = Job.objects.get(pk=Batch.objects.get(pk=batch.pk).callback_job)
    [producer] = spans(SpanKind.PRODUCER)
    assert producer.parent is None
    assert [link.context for link in producer.links] == [request.get_span_context()]
    assert callback.metadata["otel"]["traceparent"].split("-")[1] == (
        f"{producer.context.trace_id:032x}"  # type: ignore[union-attr]
    )


NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


@override_settings(
    EDDYQ={"PERIODIC": {"every-hour": {"task": add.path, "cron": "0 * * * *", "args": [1, 2]}}}
)
def test_a_periodic_run_starts_a_trace_of_its_own(run_burst_worker: RunWorker) -> None:
    enqueuer = PeriodicEnqueuer()
    enqueuer.run_once(now=NOW)
    with TRACER.start_as_current_span("some attempt") as current:
        assert enqueuer.run_once(now=NOW + timedelta(hours=1)) == 1
    [producer] = spans(SpanKind.PRODUCER)
    assert producer.parent is None
    assert [link.context for link in producer.links] == [current.get_span_context()]

    [job] = Job.objects.all()
    run_burst_worker()
    consumer = attempt_span(job)
    assert parent_id(consumer) == producer.context.span_id  # type: ignore[union-attr]
    assert consumer.context.trace_id != current.get_span_context().trace_id  # type: ignore[union-attr]


# Processes.


@pytest.mark.processes
def test_one_trace_from_a_request_to_the_job_in_a_worker_process(
    client: Client,
    start_worker: StartWorker,
    worker_environment: dict[str, str],
    tmp_path: Path,
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    worker_environment["TESTPROJECT_OTEL"] = str(spans_file)  # testproject/otel.py

    with TRACER.start_as_current_span("GET /demo/welcome/", kind=SpanKind.SERVER) as request:
        response = client.get("/demo/welcome/7/")
    job_id = response.json()["job"]
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait(60) == 0

    [producer] = spans(SpanKind.PRODUCER)
    assert parent_id(producer) == request.get_span_context().span_id
    exported = [json.loads(line) for line in spans_file.read_text().splitlines()]
    [consumer] = [
        span for span in exported if span["attributes"].get("messaging.message.id") == str(job_id)
    ]
    assert consumer["kind"] == "SpanKind.CONSUMER"
    assert consumer["name"] == "process default"
    assert consumer["context"]["trace_id"] == f"0x{request.get_span_context().trace_id:032x}"
    assert consumer["parent_id"] == f"0x{producer.context.span_id:016x}"  # type: ignore[union-attr]
    assert consumer["attributes"]["eddyq.task"] == "demo.tasks.send_welcome_email"
    assert consumer["attributes"]["eddyq.outcome"] == "completed"


# What runs in a process that does not use OpenTelemetry, whether it is installed or not.
WITHOUT_OPENTELEMETRY = """
import importlib.abc, json, sys

hide = sys.argv[1] == "hide"
asked = []


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            asked.append(name)
            if hide:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Finder())
import django

django.setup()
from django_eddyq.worker import Worker
from tests import jobs

job = jobs.add.enqueue(2, 3)
jobs.add.enqueue_many([(1, 1)] * 1000)
Worker(burst=True, maintenance=False, concurrency=2).run()
job.refresh_from_db()
print(json.dumps({
    "state": job.state,
    "metadata": job.metadata,
    "asked": asked,
    "loaded": [name for name in sys.modules if name.startswith("opentelemetry")],
}))
"""


@pytest.mark.processes
@pytest.mark.parametrize("opentelemetry", ["hide", "installed"])
def test_a_process_that_does_not_use_opentelemetry_never_imports_it(
    worker_environment: dict[str, str], opentelemetry: str
) -> None:
    environment = {
        **worker_environment,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "PYTHONPATH": f"{REPO}:{REPO / 'testproject'}",
    }
    environment.pop("TESTPROJECT_OTEL", None)
    finished = subprocess.run(
        [sys.executable, "-c", WITHOUT_OPENTELEMETRY, opentelemetry],
        env=environment,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    seen = json.loads(finished.stdout.splitlines()[-1])
    assert seen == {"state": "completed", "metadata": {}, "asked": [], "loaded": []}
