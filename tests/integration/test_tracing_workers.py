"""Traces from real prefork `celery worker` processes, over OTLP/HTTP to a local receiver."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator

import pytest

from harness.observability import tracing
from tests.cluster import Cluster

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from tests.otlp import OTLPReceiver, ReceivedSpan

pytestmark = pytest.mark.slow

#: Steps of a run of the `chain` agent: four model turns around three tool calls.
CHAIN_STEPS = 7


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as r:
        yield r


def _traced(monkeypatch: pytest.MonkeyPatch, receiver: OTLPReceiver, delay_ms: int) -> None:
    """Set before the cluster is made, so that its workers inherit them."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "harness-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", str(delay_ms))


def _own_queue() -> dict[str, str]:
    """A step queue of this test's own: other suites may share the Redis broker."""
    return {"HARNESS_QUEUE": f"otel-{uuid.uuid4().hex[:8]}"}


def _steps(spans: list[ReceivedSpan], run_id: str) -> list[ReceivedSpan]:
    found = [
        s
        for s in spans
        if s.name == tracing.STEP_SPAN and s.attributes.get(tracing.RUN_ID) == run_id
    ]
    return sorted(found, key=lambda s: int(s.attributes[tracing.STEP_INDEX]))


def _all_steps_in(run_ids: list[str]) -> Callable[[list[ReceivedSpan]], bool]:
    return lambda spans: all(len(_steps(spans, r)) >= CHAIN_STEPS for r in run_ids)


def _assert_one_trace_per_run(spans: list[ReceivedSpan], run_id: str) -> None:
    steps = _steps(spans, run_id)
    assert [s.attributes[tracing.STEP_INDEX] for s in steps] == list(range(CHAIN_STEPS))
    assert {s.trace_id for s in steps} == {steps[0].trace_id}, "a run is one trace"
    assert steps[0].parent_span_id == "", "the first step is the root"
    for before, after in itertools.pairwise(steps):
        assert after.parent_span_id == before.span_id, (before, after)
    kinds = [s.attributes[tracing.STEP_KIND] for s in steps]
    assert kinds == ["model", "tool"] * 3 + ["model"]
    assert {
        s.attributes.get(tracing.STEP_TOOL)
        for s in steps
        if s.attributes[tracing.STEP_KIND] == "tool"
    } == {"effect"}
    assert [s.attributes[tracing.OUTCOME] for s in steps][-1] == "completed"
    assert {s.attributes[tracing.STEP_ATTEMPT] for s in steps} == {1}
    assert {s.attributes[tracing.STEP_STATUS] for s in steps} == {"done"}
    assert {s.resource["service.name"] for s in steps} == {"harness-test"}


@pytest.mark.postgres
@pytest.mark.redis
def test_prefork_children_export_one_linked_span_per_step(
    make_cluster: Callable[..., Cluster], receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three runs of seven steps on a prefork worker of two children: each
    step one span, exported by the child that ran it (its provider built
    after the fork), each run one trace whose steps chain parent to child
    across the broker hops."""
    _traced(monkeypatch, receiver, delay_ms=100)
    c = make_cluster("redis", **_own_queue())
    worker = c.worker("--concurrency=2", "--pool=prefork")
    run_ids = c.start("chain", count=3)
    c.assert_completed_once(run_ids)
    spans = receiver.wait_for("every step's span", _all_steps_in(run_ids))
    for run_id in run_ids:
        _assert_one_trace_per_run(spans, run_id)
    pids = {s.resource["process.pid"] for r in run_ids for s in _steps(spans, r)}
    children = set(worker.children())
    print(f"spans from pids {sorted(pids)}; worker {worker.pid}, children {sorted(children)}")
    assert worker.pid not in pids, "the main process runs no step"
    assert pids <= children and len(pids) == 2, "both children traced their steps"
    assert worker.log().count("tracing: steps exported to otlp") == 2, worker.log()


@pytest.mark.postgres
@pytest.mark.redis
def test_a_warm_shutdown_flushes_the_spans_still_queued(
    make_cluster: Callable[..., Cluster], receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a ten-minute export delay, nothing leaves a child until it exits:
    the spans arrive when the worker is stopped (worker_process_shutdown)."""
    _traced(monkeypatch, receiver, delay_ms=600_000)
    c = make_cluster("redis", **_own_queue())
    worker = c.worker("--concurrency=2", "--pool=prefork")
    (run_id,) = c.start("chain")
    c.assert_completed_once([run_id])
    assert _steps(receiver.received(), run_id) == [], "a span left before the worker stopped"
    worker.stop()
    spans = receiver.wait_for("the spans flushed at shutdown", _all_steps_in([run_id]))
    _assert_one_trace_per_run(spans, run_id)


@pytest.mark.postgres
@pytest.mark.redis
def test_a_threads_pool_worker_traces_in_its_own_process(
    make_cluster: Callable[..., Cluster], receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fork: the worker sets itself up once, at start, for all its threads."""
    _traced(monkeypatch, receiver, delay_ms=100)
    c = make_cluster("redis", HARNESS_WORKER_POOL="threads", **_own_queue())
    worker = c.worker("--concurrency=2")
    run_ids = c.start("chain", count=2)
    c.assert_completed_once(run_ids)
    spans = receiver.wait_for("every step's span", _all_steps_in(run_ids))
    for run_id in run_ids:
        _assert_one_trace_per_run(spans, run_id)
    assert {s.resource["process.pid"] for s in spans} == {worker.pid}
    assert worker.log().count("tracing: steps exported to otlp") == 1, worker.log()
