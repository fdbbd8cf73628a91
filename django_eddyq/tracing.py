"""OpenTelemetry traces of enqueues and attempts (the ``otel`` extra: ``opentelemetry-api``),
when the project uses OpenTelemetry; nothing at all when it does not.

A producer span per enqueue call, a consumer span per attempt, with OpenTelemetry's messaging
conventions (``spans.py`` makes them). The producer span's context is stored in each job's
``metadata`` (under ``"otel"``: the propagators' ``traceparent``, ``tracestate``, ``baggage``),
so that the attempt's span, in a worker process, continues the trace of whatever enqueued the
job: a web request, or another job's attempt. Batch callbacks and periodic runs are enqueued
with ``own_trace``: their producer span starts a trace of its own, linked to the span that was
current, never its child.

Tracing is on once the project has set a global tracer provider (the SDK's), or given eddyq one
with ``use_tracer_provider``. This module imports no OpenTelemetry; ``spans.py``, which does, is
imported only once the project has imported ``opentelemetry.trace`` itself, as setting a
provider takes. So with OpenTelemetry absent, or installed and unused, nothing of it is imported
and each enqueue and attempt pays one dict lookup. With the API imported but no provider set,
they pay a clock read: the provider is looked for again once a second, until there is one.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from django_eddyq.spans import AttemptSpan, Spans
    from django_eddyq.worker.execution import ClaimedJob, Outcome, RunningJob

# The module whose presence in sys.modules says the project uses OpenTelemetry.
API_MODULE = "opentelemetry.trace"
# Asking OpenTelemetry whether a provider is set costs more than a job's share of a no-op
# drain: while none is, it is asked again at most this often.
LOOK_AGAIN_SECONDS = 1.0

# eddyq's spans: use_tracer_provider()'s, or the global provider's once one is set (it can be
# set only once).
_spans: Spans | None = None
_look_again_at = 0.0  # time.monotonic()


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Make eddyq's spans with ``provider`` instead of the global tracer provider; None: go
    back to the global one. For tests, and for a project that keeps its provider to itself
    (OpenTelemetry lets the global one be set only once per process)."""
    global _spans
    if provider is None:
        _spans = None
        return
    from django_eddyq.spans import Spans  # imports OpenTelemetry, an optional dependency

    _spans = Spans(provider)


def spans() -> Spans | None:
    """What makes eddyq's spans; None while tracing is off (see above)."""
    if _spans is not None:
        return _spans
    if API_MODULE not in sys.modules or time.monotonic() < _look_again_at:
        return None
    return _global_spans()


def _global_spans() -> Spans | None:
    global _spans, _look_again_at
    from django_eddyq.spans import Spans, global_provider  # imports OpenTelemetry: see above

    provider = global_provider()
    if provider is None:
        _look_again_at = time.monotonic() + LOOK_AGAIN_SECONDS
        return None
    _spans = Spans(provider)
    return _spans


def start_attempt(job: ClaimedJob, worker_id: str) -> AttemptSpan | None:
    """The span of ``job``'s attempt, current on this thread until ``end_attempt``; None while
    tracing is off."""
    spans_ = spans()
    return None if spans_ is None else spans_.start_attempt(job, worker_id)


def end_attempt(attempt: AttemptSpan, running: RunningJob, outcome: Outcome) -> None:
    """End the attempt's span, its handler returned with ``outcome``."""
    attempt.end(running, outcome)


def failed_at_once(job: ClaimedJob, worker_id: str, outcome: Outcome) -> None:
    """The span of an attempt that ended as it was claimed, its handler never called."""
    spans_ = spans()
    if spans_ is not None:
        spans_.failed_at_once(job, worker_id, outcome)
