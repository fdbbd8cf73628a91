"""The spans of enqueues and attempts, made with OpenTelemetry's API.

Imported by ``tracing`` only once the project uses OpenTelemetry (see there): importing this
module imports OpenTelemetry.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import Token
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

if TYPE_CHECKING:
    from django_eddyq.enqueue import JobSpec
    from django_eddyq.models import Job
    from django_eddyq.worker.execution import ClaimedJob, Outcome, RunningJob

logger = logging.getLogger(__name__)

#: The key of a job's ``metadata`` that holds the trace context of its enqueue.
METADATA_KEY = "otel"
#: ``messaging.system`` of every span.
SYSTEM = "django-eddyq"
#: The tracer's name (the instrumentation scope).
SCOPE = "django_eddyq"
# Outcomes (as signals.OUTCOMES name them) whose span ends with status ERROR.
ERROR_OUTCOMES = frozenset({"retried", "failed", "discarded"})
# What get_tracer_provider returns while no provider is set.
NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def global_provider() -> TracerProvider | None:
    """The global tracer provider; None while none is set (the API's no-op)."""
    provider = trace.get_tracer_provider()
    return None if type(provider) in NO_PROVIDER else provider


def _version() -> str:
    try:
        return version("django-eddyq")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


class Spans:
    """Makes eddyq's spans with ``provider``'s tracer."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer: Tracer = provider.get_tracer(SCOPE, _version())

    # Enqueueing.
    def publish(
        self,
        specs: Sequence[JobSpec],
        insert: Callable[[], list[Job]],
        *,
        count: int | None = None,
        own_trace: bool = False,
    ) -> list[Job]:
        """``insert()`` the jobs of ``specs`` in a producer span, each spec's metadata carrying
        the span's context; ``count``: how many jobs ``insert`` makes, if not one per spec (a
        COPY of one template). ``own_trace``: the span starts a trace, linked to the current
        span, rather than being its child."""
        count = len(specs) if count is None else count
        queues = {spec.queue for spec in specs}
        tasks = {spec.task for spec in specs}
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        name = "send"
        if len(queues) == 1:
            [queue] = queues
            attributes["messaging.destination.name"] = queue
            name = f"send {queue}"
        if len(tasks) == 1:
            [attributes["eddyq.task"]] = tasks
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        parent: Context | None = None
        links: list[Link] = []
        if own_trace:
            parent = Context()
            current = trace.get_current_span().get_span_context()
            if current.is_valid:
                links.append(Link(current))
        with self.tracer.start_as_current_span(
            name, context=parent, kind=SpanKind.PRODUCER, attributes=attributes, links=links
        ) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            if carrier:
                for spec in specs:
                    spec.metadata[METADATA_KEY] = dict(carrier)
            jobs = insert()
            if count == 1 and len(jobs) == 1:
                span.set_attribute("messaging.message.id", str(jobs[0].pk))
            return jobs

    # Attempts: the span starts and ends on the handler's thread, current while the handler
    # runs (an async handler's task copies the context of the thread that starts it).
    def start_attempt(self, job: ClaimedJob, worker_id: str) -> AttemptSpan | None:
        """The consumer span of ``job``'s attempt, made current."""
        try:
            parent = _parent_context(job.metadata.get(METADATA_KEY))
            span = self._start(job, worker_id, parent)
            token = context.attach(trace.set_span_in_context(span, parent))
        except Exception:
            logger.exception("eddyq job %s (%s): its span could not be started", job.id, job.task)
            return None
        return AttemptSpan(span, token)

    def failed_at_once(self, job: ClaimedJob, worker_id: str, outcome: Outcome) -> None:
        """The span of an attempt that ended as it was claimed (an unknown task, a malformed
        row), its handler never called."""
        try:
            span = self._start(job, worker_id, _parent_context(job.metadata.get(METADATA_KEY)))
        except Exception:
            logger.exception("eddyq job %s (%s): its span could not be started", job.id, job.task)
            return
        _end(span, outcome.kind, outcome.exception, _message(outcome))

    def _start(self, job: ClaimedJob, worker_id: str, parent: Context) -> Span:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id),
            "messaging.client.id": worker_id,
            "eddyq.task": job.task,
            "eddyq.attempt": job.attempt,
        }
        if job.batch_id is not None:
            attributes["eddyq.batch_id"] = job.batch_id
        return self.tracer.start_span(
            f"process {job.queue}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        )


@dataclasses.dataclass(slots=True)
class AttemptSpan:
    """An attempt's span, current on its handler's thread until ``end``."""

    span: Span
    token: Token[Context]

    def end(self, running: RunningJob, outcome: Outcome) -> None:
        """End it once the handler has returned, with the outcome known then."""
        try:
            context.detach(self.token)
        finally:
            _end(self.span, *_attempt_outcome(running, outcome))


def _parent_context(carrier: object) -> Context:
    """The context stored at enqueue; an empty one (a root span) without it, and for a value
    that is not what ``publish`` stores."""
    if not carrier or not isinstance(carrier, Mapping):
        return Context()
    strings = {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}
    return propagate.extract(strings, context=Context())


def _attempt_outcome(
    running: RunningJob, outcome: Outcome
) -> tuple[str, BaseException | None, str | None]:
    """What became of the attempt as it stood when its handler returned: the handler's
    outcome, or what the worker's main thread decided meanwhile (see ``Slots``)."""
    job = running.job
    if running.settled:
        # Decided without the handler: it timed out, or the job was lost to another worker.
        if running.deadline is None or time.monotonic() < running.deadline:
            return "lost", None, None
        if running.cancel.requested:
            return "cancelled", None, None
        timeout = running.handler.timeout if running.handler is not None else None
        error = TimeoutError(f"task {job.task} ran longer than its timeout of {timeout or 0:g}s")
        kind = "failed" if job.attempt >= job.max_attempts else "retried"
        return kind, error, f"TimeoutError: {error}"
    if outcome.state != "completed" and running.cancel.requested:
        return "cancelled", None, None
    if outcome.state != "completed" and running.interrupted:
        return "handed back", None, None
    return outcome.kind, outcome.exception, _message(outcome)


def _message(outcome: Outcome) -> str | None:
    return None if outcome.error is None else str(outcome.error["error"])


def _end(span: Span, kind: str, error: BaseException | None, message: str | None) -> None:
    try:
        span.set_attribute("eddyq.outcome", kind)
        if kind in ERROR_OUTCOMES:
            if error is not None:
                span.set_attribute(
                    "error.type", f"{type(error).__module__}.{type(error).__qualname__}"
                )
                try:
                    span.record_exception(error)
                except Exception:  # its message or traceback would not render
                    span.add_event("exception", {"exception.type": type(error).__qualname__})
            span.set_status(Status(StatusCode.ERROR, message))
    except Exception:
        logger.exception("eddyq: the outcome of an attempt could not be set on its span")
    finally:
        span.end()
