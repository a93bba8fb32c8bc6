"""Spans per step (harness.observability.tracing), on the SDK's in-memory exporter.

The hop between steps is Celery's own: each step message is published by a
real Celery app (``before_task_publish`` adds the trace context) on kombu's
in-memory broker, taken off the queue with its headers, and run by the
registered task (``task_prerun`` reads them), one message at a time.
"""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

import harness
from harness.celery import tracing as worker_tracing
from harness.celery.config import STEP_TASK
from harness.engine import transitions
from harness.engine.creation import create_run
from harness.engine.executor import NoCache
from harness.engine.runner import run_step
from harness.engine.runtime import Runtime
from harness.errors import ConfigError
from harness.observability import tracing
from harness.records import RunStatus
from harness.settings import Settings
from harness.store.sql import SQLStore
from tests.rig import FakeClock

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode


class Crash(BaseException):
    """Stands in for the process dying mid-step."""


@harness.tool(effect="idempotent")
def note(n: int) -> int:
    return n


@harness.tool(effect="read_only")
def refuse() -> str:
    raise ValueError("upstream said no")


@harness.tool(effect="idempotent")
def dies() -> str:
    raise Crash


def _agent(name: str, turns: list[dict[str, Any]], **kw: Any) -> str:
    harness.register_agent(
        harness.Agent(
            name=name,
            model=harness.ScriptedModel(turns),
            tools=[note, refuse, dies],
            max_steps=100,
            **kw,
        )
    )
    return name


def _calls(count: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "note", "args": {"n": i}}]} for i in range(count)
    ]
    return [*turns, {"final": "noted"}]


class Hops:
    """Step messages through a Celery app on the in-memory broker."""

    def __init__(self, store: SQLStore) -> None:
        self.app = Celery("tracing-test", broker="memory://", set_as_current=False)
        self.app.conf.task_serializer = "json"
        self.queue = f"steps-{uuid.uuid4().hex[:8]}"
        worker_tracing.instrument(self.app, Settings.from_env)
        self.rt = Runtime(store, NoCache(), FakeClock(), "w1", 30.0, self.send)
        self.task = self.app.task(name=STEP_TASK, shared=False)(self._run)
        self.messages = 0

    def _run(self, run_id: str, cursor: int | None = None) -> str:
        return run_step(self.rt, run_id, cursor).value

    def send(self, run_id: str, cursor: int, **_: object) -> None:
        self.app.send_task(STEP_TASK, (run_id,), {"cursor": cursor}, queue=self.queue)

    def deliver(self, limit: int = 100) -> None:
        """Take each message off the queue and run it, until none is left."""
        with Connection("memory://") as conn:
            queue = conn.SimpleQueue(self.queue)
            for _ in range(limit):
                try:
                    message = queue.get(block=False)
                except queue.Empty:
                    return
                message.ack()
                args, kwargs, _embed = message.decode()
                self.messages += 1
                self.task.apply(args, kwargs, headers=message.headers, throw=True)
        raise AssertionError(f"still moving after {limit} messages")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.shutdown()


@pytest.fixture
def hops(sqlite_store: SQLStore) -> Hops:
    return Hops(sqlite_store)


def _steps(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    found = [s for s in exporter.get_finished_spans() if s.name == tracing.STEP_SPAN]
    return sorted(found, key=lambda s: int(s.attributes[tracing.STEP_INDEX]))  # type: ignore[index, arg-type]


def _assert_chained(steps: list[ReadableSpan]) -> None:
    """Each step the child of the one before, in one trace."""
    assert steps[0].parent is None
    for before, after in itertools.pairwise(steps):
        assert after.parent is not None and before.context is not None
        assert after.parent.span_id == before.context.span_id
        assert after.context is not None and after.context.trace_id == before.context.trace_id


def test_a_run_is_one_trace_chained_across_celery_hops(
    spans: InMemorySpanExporter, hops: Hops
) -> None:
    name = _agent("t-chain", _calls(2))
    run_id = create_run(hops.rt, name, "goal")
    hops.deliver()
    steps = _steps(spans)
    assert hops.messages == len(steps) == 5
    _assert_chained(steps)
    assert steps[0].parent is None
    assert steps[1].parent is not None and steps[1].parent.is_remote, "it came in a message"
    attributes = [dict(s.attributes or {}) for s in steps]
    assert attributes[1] == {
        tracing.RUN_ID: run_id,
        tracing.AGENT: name,
        tracing.STEP_INDEX: 1,
        tracing.STEP_KIND: "tool",
        tracing.STEP_TOOL: "note",
        tracing.STEP_ATTEMPT: 1,
        tracing.STEP_STATUS: "done",
        tracing.OUTCOME: "advanced",
    }
    assert [a[tracing.STEP_KIND] for a in attributes] == ["model", "tool"] * 2 + ["model"]
    assert tracing.STEP_TOOL not in attributes[0]
    assert attributes[-1][tracing.OUTCOME] == "completed"
    assert {s.status.status_code for s in steps} == {StatusCode.UNSET}


def test_throughput_mode_chains_the_steps_of_one_task(
    spans: InMemorySpanExporter, hops: Hops
) -> None:
    """Several steps in one task: still each the child of the one before."""
    name = _agent("t-fast", _calls(3), steps_per_task=3)
    create_run(hops.rt, name, "goal")
    hops.deliver()
    steps = _steps(spans)
    assert len(steps) == 7 and hops.messages == 3
    _assert_chained(steps)
    remote = [s.attributes[tracing.STEP_INDEX] for s in steps if s.parent and s.parent.is_remote]  # type: ignore[index]
    assert remote == [3, 6], "the first step of each later task has its parent in the message"


def test_a_long_run_starts_a_new_trace_linked_to_the_last(
    spans: InMemorySpanExporter, hops: Hops, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "STEPS_PER_TRACE", 3)
    create_run(hops.rt, _agent("t-long", _calls(3)), "goal")
    hops.deliver()
    steps = _steps(spans)
    assert len(steps) == 7
    traces = [s.context.trace_id for s in steps if s.context is not None]
    assert traces[0:3] == [traces[0]] * 3 and traces[3:6] == [traces[3]] * 3
    assert len(set(traces)) == 3
    for first, last in ((steps[3], steps[2]), (steps[6], steps[5])):
        assert first.parent is None
        assert last.context is not None
        assert [link.context.span_id for link in first.links] == [last.context.span_id]


def test_a_failed_step_sets_the_span_status_to_error(
    spans: InMemorySpanExporter, hops: Hops
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "refuse", "args": {}}]},
        {"final": "gave up"},
    ]
    create_run(hops.rt, _agent("t-refuse", turns), "goal")
    hops.deliver()
    failed = _steps(spans)[1]
    assert failed.attributes is not None and failed.attributes[tracing.STEP_STATUS] == "failed"
    assert failed.status.status_code is StatusCode.ERROR
    assert "upstream said no" in (failed.status.description or "")


def test_an_exception_out_of_a_step_is_recorded_on_its_span(
    spans: InMemorySpanExporter, sqlite_store: SQLStore
) -> None:
    rt = Runtime(sqlite_store, NoCache(), FakeClock(), "w1", 30.0, lambda *a, **k: None)
    run_id = create_run(rt, _agent("t-dies", [{"tool_calls": [{"name": "dies"}]}]), "goal")
    run_step(rt, run_id, 0)
    with pytest.raises(Crash):
        run_step(rt, run_id, 1)
    crashed = _steps(spans)[1]
    assert crashed.status.status_code is StatusCode.ERROR
    assert [e.name for e in crashed.events] == ["exception"]
    assert tracing.OUTCOME not in (crashed.attributes or {})


def test_off_there_is_no_span_and_no_header(sqlite_store: SQLStore) -> None:
    assert not tracing.enabled()
    run, (step,) = transitions.new_run("r", "agent", "goal", 0.0)
    with tracing.step_span(run, step) as span:
        assert span is None
    headers: dict[str, Any] = {}
    tracing.inject(headers)
    assert headers == {}


@pytest.mark.parametrize(
    ("env", "exporters"),
    [
        ({}, ()),
        ({"OTEL_TRACES_EXPORTER": "none"}, ()),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": " OTLP, console "}, ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, ()),
    ],
)
def test_the_standard_variable_switches_it_on(
    env: dict[str, str], exporters: tuple[str, ...]
) -> None:
    assert Settings.from_env(env).traces_exporter == exporters


def test_off_setup_does_nothing() -> None:
    assert tracing.setup(Settings.from_env({})) is False
    assert not tracing.enabled()


def test_without_the_packages_one_line_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(ConfigError) as info:
        tracing.setup(Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp"}))
    assert str(info.value) == (
        "OTEL_TRACES_EXPORTER=otlp asks for traces, but OpenTelemetry is not installed "
        "(opentelemetry.sdk.trace): pip install -e '.[otel]' in the harness's clone"
    )
    settings = Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp"})
    monkeypatch.setattr(worker_tracing, "_refused", False)
    with caplog.at_level(logging.ERROR, logger="harness.celery.tracing"):
        worker_tracing._start(settings, prefork_parent=True)  # what a worker does at start
        worker_tracing._start(settings)  # and then its pool process: said once
    [record] = caplog.records
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert not tracing.enabled()


def test_an_unknown_exporter_is_named() -> None:
    with pytest.raises(ConfigError, match="no span exporter named 'nosuch'"):
        tracing.setup(Settings.from_env({"OTEL_TRACES_EXPORTER": "nosuch"}))
    assert not tracing.enabled()


SETUP = """
import os
from opentelemetry import trace
from harness.observability import tracing
from harness.settings import Settings
assert tracing.setup(Settings.from_env())
provider = trace.get_tracer_provider()
attributes = provider.resource.attributes
print(attributes["service.name"], attributes["process.pid"] == os.getpid())
tracing.shutdown()
"""


@pytest.mark.parametrize(
    ("env", "service"),
    [({}, "celery-agent-harness"), ({"OTEL_SERVICE_NAME": "billing-agents"}, "billing-agents")],
)
def test_setup_builds_the_global_provider_for_this_process(
    env: dict[str, str], service: str
) -> None:
    env = {"PATH": "/usr/bin:/bin", "OTEL_TRACES_EXPORTER": "console", **env}
    done = subprocess.run(
        [sys.executable, "-c", SETUP], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [service, "True"]


class _BrokenTracer:
    """A tracer whose spans fail to start, or to end."""

    def __init__(self, fails_at: str) -> None:
        self.fails_at = fails_at

    @contextmanager
    def start_as_current_span(self, *_: Any, **__: Any) -> Iterator[Any]:
        if self.fails_at == "start":
            raise RuntimeError("exporter misconfigured")
        yield trace.INVALID_SPAN
        if self.fails_at == "end":
            raise RuntimeError("exporter gone")


@pytest.mark.parametrize("fails_at", ["start", "end"])
def test_a_tracing_failure_never_fails_a_step(
    fails_at: str,
    hops: Hops,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(tracing, "_tracer", _BrokenTracer(fails_at))
    monkeypatch.setattr(tracing, "_complained", set())
    run_id = create_run(hops.rt, _agent(f"t-broken-{fails_at}", _calls(2)), "goal")
    hops.deliver()
    run = hops.rt.store.load(run_id)
    assert (run.status, run.step_count) == (RunStatus.COMPLETED, 5)
    warnings = [r for r in caplog.records if "tracing: could not" in r.getMessage()]
    assert len(warnings) == 1  # said once, not once per step
