"""OpenTelemetry for the test project's processes, when ``TESTPROJECT_OTEL`` asks for it.

For tests and benchmarks only: an application sets up OpenTelemetry its own way (see
docs/observability.md). Needs ``opentelemetry-sdk`` (in the ``dev`` extra).

* ``TESTPROJECT_OTEL=api``: OpenTelemetry's API imported, no tracer provider set (its no-op).
* ``TESTPROJECT_OTEL=drop``: an SDK tracer provider whose spans go through a batch span
  processor to an exporter that drops them: what tracing costs, as ``benchmarks/`` measure it.
  ``drop:0.1``: the same, sampling a tenth of the traces (``ParentBased(TraceIdRatioBased)``);
  ``drop:0``: none.
* ``TESTPROJECT_OTEL=/path/to/spans.jsonl``: each span, as it ends, appended to that file as a
  line of JSON (``ReadableSpan.to_json``), for a test to read.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased


class DroppingExporter(SpanExporter):
    """Takes spans and keeps none."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def configure(setting: str) -> None:
    """Set the process's global tracer provider as ``setting`` says (see above)."""
    if setting == "api":
        return
    kind, _, ratio = setting.partition(":")
    sampler = ParentBased(TraceIdRatioBased(float(ratio))) if ratio else None
    provider = TracerProvider(sampler=sampler)
    if kind == "drop":
        provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
    else:
        spans_file = open(setting, "a", encoding="utf-8")  # noqa: SIM115 (open while it runs)
        exporter = ConsoleSpanExporter(
            out=spans_file, formatter=lambda span: span.to_json(indent=None) + "\n"
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
