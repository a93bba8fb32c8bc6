"""OpenTelemetry spans per step: the optional extra ``otel``.

Off unless ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``: OTLP/HTTP
to ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``console``; or any installed package's
``opentelemetry_traces_exporter`` entry point). The SDK reads its other
variables itself (``OTEL_SERVICE_NAME``, ``OTEL_BSP_SCHEDULE_DELAY``, ...).
Off, a step costs one ``None`` check and nothing OpenTelemetry is imported,
so the harness runs without the extra installed; on without it, the worker
logs one line saying what to install and carries on untraced.

Why it is built the way it is:

* **One span per step execution** (:data:`STEP_SPAN`), current while the
  step runs, so spans that tool code or an instrumented HTTP client make
  nest under it. Attributes: run id, agent, step index, kind, tool, attempt,
  the step's status and the runner's outcome, and a model turn's tokens; a
  failed step sets the span's status to ERROR with the step's error, an
  exception escaping the runner is recorded on it. Messages that execute
  nothing (stale, duplicate, early) make no span: the event table has them.
* **Linked across the Celery hop.** The span context of the last step a
  task ran goes into the headers of the step message it sends (W3C
  ``traceparent``, added in ``before_task_publish``), and the task that takes
  that message parents its first step on it (``task_prerun``). A run is one
  trace, each step the child of the one before, for :data:`STEPS_PER_TRACE`
  steps; then a new trace begins with a link to the last one, because a
  10,000-step run as a single trace 10,000 deep is more than tracing
  backends keep or draw. No root span per run: no process lives for the
  run. A step re-sent by the sweeper starts a new trace (the lost message
  had the context); every trace of a run carries ``harness.run_id``.
* **Set up after the fork.** The SDK's batch processor exports from a
  thread, and threads do not survive ``fork``: the provider is built in
  each prefork child (``worker_process_init``), in the worker itself for
  the solo and threads pools (``celeryd_after_setup``), and flushed when the
  process ends (``worker_process_shutdown``, ``worker_shutdown``). A forked
  child forgets whatever provider it inherited.

This module is the OpenTelemetry half, and imports neither Celery nor the
engine: the runner calls :func:`step_span`, :func:`executed` and
:func:`outcome`; the Celery half (harness.celery.tracing) connects the
signals that set it up in each worker process and carry the context across
each step message (:func:`inject`, :func:`receive`, :func:`finished`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, cast

from harness.errors import ConfigError
from harness.models import Usage
from harness.records import Run, Step, StepStatus
from harness.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Link, Span, SpanContext, Tracer

log = logging.getLogger(__name__)

#: The name of every step's span.
STEP_SPAN = "harness.step"
#: Steps of a run in one trace; the next one starts a new trace linked to it.
STEPS_PER_TRACE = 1000
#: ``service.name`` unless OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) says otherwise.
SERVICE_NAME = "celery-agent-harness"
#: What to install when tracing is asked for without the packages.
EXTRA = "pip install -e '.[otel]' in the harness's clone"

# Span attributes.
RUN_ID = "harness.run_id"
AGENT = "harness.agent"
STEP_INDEX = "harness.step.index"
STEP_KIND = "harness.step.kind"
STEP_TOOL = "harness.step.tool"
STEP_ATTEMPT = "harness.step.attempt"
STEP_STATUS = "harness.step.status"
OUTCOME = "harness.step.outcome"
INPUT_TOKENS = "harness.usage.input_tokens"
OUTPUT_TOKENS = "harness.usage.output_tokens"

#: W3C trace context headers, as a step message carries them.
HEADERS = ("traceparent", "tracestate")

_tracer: Tracer | None = None  # None: tracing is off in this process
_provider: TracerProvider | None = None
#: The span of the step this task ran last (or the one its message came
#: from): the parent of its next step, and what the next message carries.
_previous: ContextVar[SpanContext | None] = ContextVar("harness_previous_step", default=None)
_OFF: AbstractContextManager[None] = nullcontext()


def enabled() -> bool:
    """Are steps traced in this process?"""
    return _tracer is not None


def setup(settings: Settings) -> bool:
    """Trace steps in this process if the settings ask for it; True if on.

    Idempotent. Raises :class:`ConfigError`, one line, when the packages of
    the ``otel`` extra are missing or an exporter is unknown. The provider
    becomes OpenTelemetry's global one unless the process set its own.
    """
    names = settings.traces_exporter
    if not names or _tracer is not None:
        return _tracer is not None
    exporters = _exporters(names)
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=_resource())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter()))
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    use(provider)
    log.info("tracing: steps exported to %s from process %d", ", ".join(names), os.getpid())
    return True


def use(provider: TracerProvider) -> None:
    """Trace steps through ``provider`` (:func:`setup` builds one; tests pass
    one with an in-memory exporter)."""
    global _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer("harness")


def shutdown() -> None:
    """Export the spans still queued and stop tracing in this process."""
    global _tracer, _provider
    provider, _tracer, _provider = _provider, None, None
    if provider is not None:
        provider.shutdown()


def forget() -> None:
    """In a forked child: the inherited provider's export thread stayed in
    the parent. Drop it unflushed (the parent flushes its own spans)."""
    global _tracer, _provider
    _tracer, _provider = None, None


def check(settings: Settings) -> None:
    """Raise :class:`ConfigError` if the settings ask for traces that
    :func:`setup` cannot make here; build nothing (a prefork parent)."""
    names = settings.traces_exporter
    if names:
        _exporters(names)


def _exporters(names: tuple[str, ...]) -> list[Callable[[], SpanExporter]]:
    """The exporter classes for ``names``, with the SDK imported: one line
    saying what to install if it is not."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401

        return [_exporter(name) for name in names]
    except ImportError as err:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={','.join(names)} asks for traces, but OpenTelemetry "
            f"is not installed ({err.name or err}): {EXTRA}"
        ) from None


def _exporter(name: str) -> Callable[[], SpanExporter]:
    if name in ("otlp", "otlp_proto_http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER: no span exporter named {name!r} is installed "
            "(otlp, console, or a package's opentelemetry_traces_exporter entry point)"
        )
    return cast("Callable[[], SpanExporter]", next(iter(found)).load())


def _resource() -> Any:
    """Who exports: the service, and this process (each prefork child is one)."""
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"process.pid": os.getpid(), "host.name": socket.gethostname()})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    return resource


def step_span(run: Run, step: Step) -> AbstractContextManager[Span | None]:
    """The span of one execution of ``step`` (the step as loaded, before
    this attempt), current while it runs; a no-op yielding None when off.

    It never raises of its own: the step it wraps has been claimed, and a
    tracing failure must not leave it unexecuted, nor drop its outcome."""
    if _tracer is None:
        return _OFF
    return _guarded(_step_span(_tracer, run, step))


@contextmanager
def _guarded(span_cm: AbstractContextManager[Span]) -> Iterator[Span | None]:
    """``span_cm``, with its own failures logged once and swallowed; the
    body's exceptions pass through unchanged."""
    try:
        span: Span | None = span_cm.__enter__()
    except Exception:
        _complain("start a step span")
        yield None
        return
    try:
        yield span
    except BaseException as err:
        try:
            span_cm.__exit__(type(err), err, err.__traceback__)
        except BaseException as failed:
            if failed is not err:
                _complain("end a step span")
        raise
    try:
        span_cm.__exit__(None, None, None)
    except Exception:
        _complain("end a step span")


_complained: set[str] = set()


def _complain(what: str) -> None:
    if what not in _complained:
        _complained.add(what)
        log.warning("tracing: could not %s (reported once per process)", what, exc_info=True)


@contextmanager
def _step_span(tracer: Tracer, run: Run, step: Step) -> Iterator[Span]:
    from opentelemetry.trace import StatusCode

    context, links = _parent(step.index)
    attributes: dict[str, str | int] = {
        RUN_ID: run.run_id,
        AGENT: run.agent,
        STEP_INDEX: step.index,
        STEP_KIND: step.kind.value,
        STEP_ATTEMPT: step.attempts + 1,
    }
    if step.tool is not None:
        attributes[STEP_TOOL] = step.tool
    with tracer.start_as_current_span(
        STEP_SPAN, context=context, links=links, attributes=attributes
    ) as span:
        try:
            yield span
        except Exception:
            raise  # recorded by the SDK
        except BaseException as err:  # the process told to stop mid-step: say so too
            span.record_exception(err, escaped=True)
            span.set_status(StatusCode.ERROR, f"{type(err).__name__}: step interrupted")
            raise
        finally:
            _previous.set(span.get_span_context())


def _parent(index: int) -> tuple[Context | None, list[Link]]:
    """Child of the previous step; or, every STEPS_PER_TRACE steps, a new
    trace linked to it. No previous step: the current context (a root span,
    unless the caller traces the task itself)."""
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, NonRecordingSpan, set_span_in_context

    previous = _previous.get()
    if previous is None:
        return None, []
    if index > 0 and index % STEPS_PER_TRACE == 0:
        return Context(), [Link(previous)]
    return set_span_in_context(NonRecordingSpan(previous)), []


class Executed(Protocol):
    """What the span needs of a step's outcome (harness.engine.transitions.StepOutcome)."""

    @property
    def status(self) -> StepStatus: ...

    @property
    def usage(self) -> Usage | None: ...

    @property
    def error(self) -> str | None: ...


def executed(result: Executed | None) -> None:
    """What the step's execution produced, on the current step span (None:
    it was rescheduled, to wait for its provider). Never raises: the result
    it describes is in hand and not yet recorded."""
    if _tracer is None:
        return
    try:
        _executed(result)
    except Exception:
        _complain("record a step's outcome on its span")


def _executed(result: Executed | None) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import StatusCode

    span = trace.get_current_span()
    if result is None:
        span.set_attribute(STEP_STATUS, "rescheduled")
        return
    span.set_attribute(STEP_STATUS, result.status.value)
    if result.usage is not None:
        span.set_attribute(INPUT_TOKENS, result.usage.input_tokens)
        span.set_attribute(OUTPUT_TOKENS, result.usage.output_tokens)
    if result.status is StepStatus.FAILED or result.error:
        span.set_status(StatusCode.ERROR, result.error or result.status.value)


def outcome(span: Span | None, value: str) -> None:
    """What the runner made of the step (``advanced``, ``completed``, ...)."""
    if span is None:
        return
    try:
        span.set_attribute(OUTCOME, value)
    except Exception:
        _complain("set a span's outcome")


def inject(headers: MutableMapping[str, Any]) -> None:
    """Put the span context of this task's last step into the headers of the
    step message it sends (W3C trace context)."""
    if _tracer is None:
        return
    previous = _previous.get()
    if previous is None:
        return
    from opentelemetry.trace import NonRecordingSpan, set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(headers, set_span_in_context(NonRecordingSpan(previous)))


def receive(headers: Mapping[str, Any]) -> None:
    """A step message arrived: its span context parents the task's first step."""
    _previous.set(None)
    if _tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {k: v for k in HEADERS if isinstance(v := headers.get(k), str)}
    context = TraceContextTextMapPropagator().extract(carrier)
    span_context = trace.get_current_span(context).get_span_context()
    if span_context.is_valid:
        _previous.set(span_context)


def finished() -> None:
    """The task is over: its steps parent nothing that comes after in this thread."""
    _previous.set(None)
