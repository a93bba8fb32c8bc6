"""Prometheus metrics: the store's counts at scrape time, the workers' files,
and the Grafana dashboard's queries against the names actually exposed."""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import re
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool
from prometheus_client import CollectorRegistry, Counter, generate_latest, values
from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import observability
from harness.celery import hooks
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.observability import files, metrics
from harness.reads import Reads
from harness.records import RunStatus
from harness.settings import Settings
from harness.store import Checkpoint, EventDraft, SweepKind
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from tests.rig import Rig

REPO = Path(__file__).resolve().parents[2]


class Crash(BaseException):
    """Stands in for the process dying mid-call: the step stays RUNNING."""


@harness.tool(effect="idempotent")
def tick(n: int) -> int:
    return n


@harness.tool(effect="idempotent")
def hangs() -> None:
    raise Crash


def _agent(name: str, tool: Any, calls: int) -> str:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": tool.name, "args": {"n": i} if tool is tick else {}}]}
        for i in range(calls)
    ]
    harness.register_agent(
        harness.Agent(
            name=name, model=harness.ScriptedModel([*turns, {"final": "ok"}]), tools=[tool]
        )
    )
    return name


TICKS = _agent("obs-ticks", tick, 2)
HANGS = _agent("obs-hangs", hangs, 1)


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by name and sorted labels."""
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


@pytest.fixture
def rig(memory_store: MemoryStore) -> Rig:
    return Rig(memory_store)


def _reads(rig: Rig) -> Reads:
    return Reads(rig.store, rig.clock, running_alert=60.0)


def test_the_store_counts_are_exposed(rig: Rig) -> None:
    for _ in range(3):
        create_run(rig.runtime(), TICKS, "tick twice")
    rig.drive()
    body, content_type = metrics.exposition(_reads(rig), Settings.from_env({}))
    assert content_type.startswith("text/plain")
    got = samples(body)
    assert got[("harness_store_up", ())] == 1
    assert got[("harness_runs", (("status", "completed"),))] == 3
    assert got[("harness_runs", (("status", "failed"),))] == 0
    assert got[("harness_stale_writes_total", ())] == 0
    assert got[("harness_oldest_running_step_age_seconds", ())] == 0
    assert got[("harness_running_alert_seconds", ())] == 60
    exposed = {name for name, _ in got}
    assert {f"{n}_total" for n, _ in metrics.STORE_COUNTERS.values()} <= exposed
    assert "harness_steps_total" not in exposed  # no HARNESS_METRICS_DIR: no worker files


def test_a_step_left_running_shows_its_age_and_the_alert(rig: Rig) -> None:
    create_run(rig.runtime(), HANGS, "hang")
    with pytest.raises(Crash):
        rig.drive()
    rig.clock.advance(90)
    got = samples(metrics.exposition(_reads(rig), Settings.from_env({}))[0])
    assert got[("harness_oldest_running_step_age_seconds", ())] == 90
    assert got[("harness_running_steps_over_alert", ())] == 1
    assert got[("harness_runs", (("status", "running"),))] == 1


def test_the_last_sweep_age_is_exposed_and_infinite_before_any(rig: Rig) -> None:
    got = samples(metrics.exposition(_reads(rig), Settings.from_env({}))[0])
    assert got[("harness_last_sweep_age_seconds", ())] == math.inf
    recovery.sweep(rig.runtime("beat"), kind=SweepKind.BEAT)
    rig.clock.advance(12)
    got = samples(metrics.exposition(_reads(rig), Settings.from_env({}))[0])
    assert got[("harness_last_sweep_age_seconds", ())] == 12


def test_an_unreachable_store_is_reported_not_raised(tmp_path: Path) -> None:
    unmigrated = SQLStore.from_url(f"sqlite:///{tmp_path / 'empty.db'}")
    reads = Reads(unmigrated, Rig(unmigrated).clock, running_alert=60.0)
    got = samples(metrics.exposition(reads, Settings.from_env({}))[0])
    unmigrated.close()
    assert got == {("harness_store_up", ()): 0}


@pytest.fixture
def measuring(tmp_path: Path) -> Iterator[Settings]:
    """This process measures steps into a metrics dir, as a pool child does."""
    settings = Settings.from_env({"HARNESS_METRICS_DIR": str(tmp_path / "metrics")})
    assert metrics.start_worker_process(settings, metrics.slot_identifier("test@host", 0))
    try:
        yield settings
    finally:
        metrics.stop_worker_process()


def test_steps_are_counted_by_kind_and_outcome(rig: Rig, measuring: Settings) -> None:
    for _ in range(2):
        create_run(rig.runtime(), TICKS, "tick twice")
    rig.drive()
    got = samples(metrics.exposition(_reads(rig), measuring)[0])
    assert got[("harness_steps_total", (("kind", "model"), ("outcome", "done")))] == 6
    assert got[("harness_steps_total", (("kind", "tool"), ("outcome", "done")))] == 4
    tool_done = (("kind", "tool"), ("outcome", "done"))
    assert got[("harness_step_duration_seconds_count", tool_done)] == 4
    # Each tool step: a RUNNING write before and a result after; model steps go straight through.
    assert got[("harness_checkpoint_duration_seconds_count", (("phase", "running"),))] == 4
    assert got[("harness_checkpoint_duration_seconds_count", (("phase", "result"),))] == 10
    assert sorted(p.name for p in measuring.metrics_dir.iterdir()) == [  # type: ignore[union-attr]
        "counter_test@host-0.db",
        "histogram_test@host-0.db",
        "test@host-0.lock",
    ]


def test_model_tokens_and_cost_are_counted_by_model(measuring: Settings, rig: Rig) -> None:
    metrics.model_usage("gpt-x", harness.models.Usage(10, 3), 0.25)
    metrics.model_usage("gpt-x", harness.models.Usage(5, 1), None)
    got = samples(metrics.exposition(_reads(rig), measuring)[0])
    assert got[("harness_model_tokens_total", (("direction", "input"), ("model", "gpt-x")))] == 15
    assert got[("harness_model_tokens_total", (("direction", "output"), ("model", "gpt-x")))] == 4
    assert got[("harness_model_cost_usd_total", (("model", "gpt-x"),))] == 0.25


def _child_counts(directory: str, steps: int) -> None:
    """A pool child of slot 0: measures ``steps`` results, then exits."""
    settings = Settings.from_env({"HARNESS_METRICS_DIR": directory})
    metrics.start_worker_process(settings, metrics.slot_identifier("node@host", 0))
    result = Checkpoint("r", 1, "w", 0.0, events=(EventDraft("done", "running", 1),))
    for _ in range(steps):
        metrics.checkpoint_written(result, "tool", 0.01, 0.001)


def test_a_replacement_child_counts_on_in_its_predecessors_files(tmp_path: Path, rig: Rig) -> None:
    directory = tmp_path / "metrics"
    fork = multiprocessing.get_context("fork")
    for steps in (3, 2, 4):  # three children in turn fill slot 0
        child = fork.Process(target=_child_counts, args=(str(directory), steps))
        child.start()
        child.join(30)
        assert child.exitcode == 0
    settings = Settings.from_env({"HARNESS_METRICS_DIR": str(directory)})
    got = samples(metrics.exposition(_reads(rig), settings)[0])
    assert got[("harness_steps_total", (("kind", "tool"), ("outcome", "done")))] == 9
    assert len(list(directory.iterdir())) == 3  # counters, histograms, the slot's lock


def _children_with(directory: str, identifier: str, queue: Any) -> None:
    """A second process started with a slot name already held."""
    settings = Settings.from_env({"HARNESS_METRICS_DIR": directory})
    metrics.start_worker_process(settings, identifier)
    result = Checkpoint("r", 1, "w", 0.0, events=(EventDraft("done", "running", 1),))
    metrics.checkpoint_written(result, "model", 0.01, 0.001)
    queue.put(sorted(p.name for p in Path(directory).iterdir()))


def test_a_slot_name_held_by_a_live_process_is_not_shared(
    tmp_path: Path, rig: Rig, measuring: Settings
) -> None:
    # This process holds slot test@host-0 (the fixture); a worker started
    # with the same node name forks a child that asks for the same slot.
    directory = str(measuring.metrics_dir)
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    child = fork.Process(target=_children_with, args=(directory, "test@host-0", queue))
    child.start()
    names = queue.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0
    assert "counter_test@host-0+1.db" in names and "test@host-0+1.lock" in names, names
    result = Checkpoint("r", 1, "w", 0.0, events=(EventDraft("done", "running", 1),))
    metrics.checkpoint_written(result, "tool", 0.01, 0.001)
    got = samples(metrics.exposition(_reads(rig), measuring)[0])
    assert got[("harness_steps_total", (("kind", "model"), ("outcome", "done")))] == 1
    assert got[("harness_steps_total", (("kind", "tool"), ("outcome", "done")))] == 1
    # The child is gone, its lock with it: the next one takes its spare name back.
    child = fork.Process(target=_children_with, args=(directory, "test@host-0", queue))
    child.start()
    assert queue.get(timeout=30) == names
    child.join(30)


def test_an_unusable_directory_turns_measuring_off_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    settings = Settings.from_env({"HARNESS_METRICS_DIR": str(not_a_dir / "metrics")})
    with caplog.at_level(logging.WARNING, "harness.observability"):
        assert not metrics.start_worker_process(settings, "w-0")
    assert not metrics.enabled()
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "off in this process" in caplog.records[0].getMessage()
    result = Checkpoint("r", 1, "w", 0.0, events=(EventDraft("done", "running", 1),))
    metrics.checkpoint_written(result, "tool", 0.01, 0.001)  # a no-op, not an error


def test_the_files_pages_are_allocated_before_they_are_mapped(measuring: Settings) -> None:
    for path in measuring.metrics_dir.glob("*.db"):  # type: ignore[union-attr]
        stat = path.stat()
        assert stat.st_size == files.PREALLOCATED, path.name
        assert stat.st_blocks * 512 >= stat.st_size, f"{path.name} is sparse"


def _on_a_small_disk(directory: str, limit: int, queue: Any) -> None:
    """Measure under a file-size limit (a disk that fills up: ``EFBIG``
    where a full disk says ``ENOSPC``), counting ever more model names."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    settings = Settings.from_env({"HARNESS_METRICS_DIR": directory})
    started = metrics.start_worker_process(settings, "small-0")
    for n in range(5000 if started else 1):
        observability.model_usage(f"model-{n}", harness.models.Usage(1, 1), 0.1)
    queue.put(started)


@pytest.mark.parametrize("limit", [files.PREALLOCATED // 2, files.PREALLOCATED + 4096])
def test_a_full_disk_stops_measuring_not_the_process(tmp_path: Path, limit: int) -> None:
    """Below the preallocation: measuring is off from the start. Above it: the
    counter file must grow for new model names, the growth is refused, and
    each refused sample is dropped while the process runs on."""
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    child = fork.Process(target=_on_a_small_disk, args=(str(tmp_path / "m"), limit, queue))
    child.start()
    started = queue.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0
    assert started == (limit > files.PREALLOCATED)
    for path in (tmp_path / "m").glob("*.db"):
        assert path.stat().st_size <= limit


def test_committed_and_model_usage_never_raise(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(metrics, "checkpoint_written", broken)
    monkeypatch.setattr(metrics, "model_usage", broken)
    monkeypatch.setattr(observability, "_warned", False)
    result = Checkpoint("r", 1, "w", 0.0, events=(EventDraft("done", "running", 1),))
    with caplog.at_level(logging.WARNING, "harness.observability"):
        for _ in range(3):
            observability.committed(result, 2, kind="tool", duration=0.1, write=0.01)
            observability.model_usage("m", harness.models.Usage(1, 1), None)
    warnings = [r for r in caplog.records if r.name == "harness.observability"]
    assert len(warnings) == 1 and warnings[0].exc_info is not None


def test_a_users_own_metrics_stay_out_of_the_harness_directory(
    rig: Rig, measuring: Settings
) -> None:
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    assert not getattr(values.ValueClass, "_multiprocess", False)
    registry = CollectorRegistry()
    jobs = Counter("shop_jobs", "The user's own counter.", ["queue"], registry=registry)
    jobs.labels("orders").inc()
    assert 'shop_jobs_total{queue="orders"} 1.0' in generate_latest(registry).decode()
    got = samples(metrics.exposition(_reads(rig), measuring)[0])
    assert not any(name.startswith("shop_jobs") for name, _ in got)


@pytest.mark.parametrize(
    ("pool", "prefork"),
    [
        ("prefork", True),
        ("processes", True),
        ("celery.concurrency.prefork:TaskPool", True),
        (PreforkPool, True),
        (type("MyPool", (PreforkPool,), {}), True),
        ("solo", False),
        ("threads", False),
        (SoloPool, False),
        ("no.such.module:Pool", False),
    ],
)
def test_the_pool_is_recognised_before_and_after_celery_resolves_it(
    pool: Any, prefork: bool
) -> None:
    worker = type("Worker", (), {"pool_cls": pool})()
    assert hooks._pool_is_prefork(worker) is prefork


def test_metrics_port_needs_a_directory() -> None:
    with pytest.raises(harness.errors.ConfigError, match="HARNESS_METRICS_DIR"):
        Settings.from_env({"HARNESS_METRICS_PORT": "9808"})


def _queried_names(dashboard: dict[str, Any]) -> dict[str, set[str]]:
    names = {}
    for panel in dashboard["panels"]:
        exprs = [t["expr"] for t in panel.get("targets", [])]
        assert exprs, f"panel {panel['title']!r} queries nothing"
        found = set()
        for expr in exprs:
            for name in re.findall(r"\bharness_[a-z_]+", expr):
                found.add(re.sub(r"_(bucket|sum|count)$", "", name))
        names[panel["title"]] = found
    return names


def test_the_grafana_dashboard_queries_only_exposed_metrics() -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    exposed = metrics.STORE_METRICS | metrics.WORKER_METRICS
    queried = _queried_names(dashboard)
    for title, names in queried.items():
        assert names, f"panel {title!r} uses no harness metric"
        assert names <= exposed, f"panel {title!r}: {names - exposed} are not exposed"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
    # And every metric exposed has a panel.
    assert set().union(*queried.values()) == exposed


def test_the_declared_names_are_the_exposed_ones(rig: Rig, measuring: Settings) -> None:
    create_run(rig.runtime(), TICKS, "tick twice")
    rig.drive()
    metrics.model_usage("m", harness.models.Usage(1, 1), 0.1)
    got = samples(metrics.exposition(_reads(rig), measuring)[0])
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name, _ in got}
    assert families == metrics.STORE_METRICS | metrics.WORKER_METRICS
    assert RunStatus.COMPLETED.value in {dict(labels).get("status") for _, labels in got}
