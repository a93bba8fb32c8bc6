"""Prometheus metrics: durable counts read from the store, per-step
measurements written by the worker processes.

Two sources, each the honest one for what it measures:

* **The store**, read at scrape time (:class:`StoreCollector`): what the
  flight recorder and the counters table already hold durably, the numbers
  of ``harness stats`` (stale writes, lease takeovers, steps found RUNNING at
  recovery, in-doubt steps, sweeper re-sends, runs by status, running steps
  past the alert), the oldest RUNNING step's age and the last sweep's. No
  worker has to be alive, nor to have been alive, for them to be right, and
  every API replica reports the same numbers. A scrape costs four aggregate
  queries plus one index lookup (the events count reads the events table:
  see the README), and two reads of the small sweeps table. The waits on
  the world add four: deferred calls by kind and the oldest wait (both read
  from the waiting runs' steps), signals kept, and timeouts and children
  started (a second pass over the events table).
* **The workers**, measured as each checkpoint commits: steps by kind and
  outcome, step and checkpoint-write durations, model tokens and cost by
  model (the model's name is known to the worker, not recorded in the
  store). Under the prefork pool several child processes measure at once, so
  they write prometheus_client's multiprocess files in ``HARNESS_METRICS_DIR``
  (memory-mapped: no system call per step) and whoever scrapes merges them
  with ``MultiProcessCollector``. A file is named after the pool *slot*
  (worker node name and billiard's child index), not the pid: a child
  recycled by ``--max-tasks-per-child`` or killed is replaced by one with
  the same index, which reopens its predecessor's files and counts on from
  their values. So the directory holds two files (counters, histograms)
  and a lock file per slot however many children come and go, and counters
  never go back. A slot's name is locked while a process writes it: a
  second worker started with the same node name on the host writes under
  spare names instead (``<slot>+1``...; see :mod:`.files`, which also keeps
  a full disk from killing a worker). Gauges are not measured there.

Worker metrics are off unless :func:`start_worker_process` ran in the
process (the Celery hooks call it at pool-child start): the engine's calls
then cost one ``is None`` test. Several hosts have a directory each; the
API reads its own host's, and ``HARNESS_METRICS_PORT`` has a worker host's
main process serve its directory for Prometheus (:func:`serve`).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from harness.clock import Clock
from harness.errors import StoreError
from harness.models import Usage
from harness.observability.files import CounterFile, HistogramFile, SlotFiles
from harness.records import JSON, RunStatus, StepKind, StepStatus, WaitKind
from harness.settings import Settings
from harness.store import Checkpoint, Stats

log = logging.getLogger(__name__)

#: Step statuses that end an execution: a step counted by outcome.
RESULTS = frozenset({StepStatus.DONE.value, StepStatus.FAILED.value, StepStatus.IN_DOUBT.value})
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
#: ``harness stats`` names -> counter names (``_total`` is appended).
STORE_COUNTERS = {
    "stale_writes_rejected": (
        "harness_stale_writes",
        "Checkpoints rejected because another writer had moved the run on (CAS).",
    ),
    "lease_takeovers": (
        "harness_lease_takeovers",
        "Runs taken over from a worker whose lease had expired.",
    ),
    "recovered_running_steps": (
        "harness_recovered_running_steps",
        "Steps found RUNNING when a worker took the run over: interrupted executions.",
    ),
    "in_doubt_steps": (
        "harness_in_doubt_steps",
        "at_most_once tool steps left in doubt after an interruption.",
    ),
    "sweeper_redispatches": (
        "harness_sweeper_redispatches",
        "Step messages re-sent by the sweeper.",
    ),
    "back_offs": ("harness_back_offs", "Claims that gave way to a busy idempotency key."),
    "runs_blocked": (
        "harness_runs_blocked",
        "Times a worker recorded why it could not carry a run.",
    ),
    "model_retries": ("harness_model_retries", "Transient provider failures retried later."),
    "rate_limit_waits": ("harness_rate_limit_waits", "Waits for a shared provider rate limit."),
}
#: Every metric name this module exposes (as written in PromQL).
STORE_METRICS = frozenset(
    {f"{name}_total" for name, _ in STORE_COUNTERS.values()}
    | {
        "harness_runs",
        "harness_running_steps_over_alert",
        "harness_running_alert_seconds",
        "harness_oldest_running_step_age_seconds",
        "harness_last_sweep_age_seconds",
        "harness_store_up",
        "harness_deferred_steps",
        "harness_signals_kept",
        "harness_wait_timeouts_total",
        "harness_children_started_total",
        "harness_oldest_wait_age_seconds",
    }
)
WORKER_METRICS = frozenset(
    {
        "harness_steps_total",
        "harness_step_duration_seconds",
        "harness_checkpoint_duration_seconds",
        "harness_model_tokens_total",
        "harness_model_cost_usd_total",
    }
)


class Reads(Protocol):
    """What a scrape reads: harness.reads.Reads is one. Named here, not
    imported, so that the engine, which reports through this package, and
    the read service, which reads the engine's records, stay one way round."""

    @property
    def store(self) -> Stats: ...

    @property
    def clock(self) -> Clock: ...

    def stats(self) -> dict[str, JSON]: ...


class StoreCollector(Collector):
    """The store's durable counts, read when Prometheus scrapes. An
    unreachable store is reported as ``harness_store_up 0``, not an error,
    so the worker metrics of the same scrape still arrive."""

    def __init__(self, reads: Reads) -> None:
        self.reads = reads

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("harness_store_up", "1 if the run store answered this scrape.")
        try:
            stats = self.reads.stats()
            oldest = self.reads.store.oldest_running_step_started_at()
        except StoreError as err:
            log.warning("metrics: the run store did not answer: %s", err)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for key, (name, documentation) in STORE_COUNTERS.items():
            yield CounterMetricFamily(name, documentation, value=_number(stats[key]))
        runs = GaugeMetricFamily("harness_runs", "Runs in each status.", labels=["status"])
        counts = stats["runs_by_status"]
        assert isinstance(counts, dict)
        for status in RunStatus:
            runs.add_metric([status.value], counts.get(status.value, 0))
        yield runs
        yield GaugeMetricFamily(
            "harness_running_steps_over_alert",
            "Steps RUNNING for longer than HARNESS_RUNNING_ALERT, in runs still moving.",
            value=_number(stats["running_steps_older_than_alert"]),
        )
        yield GaugeMetricFamily(
            "harness_running_alert_seconds",
            "The stuck-step threshold (HARNESS_RUNNING_ALERT).",
            value=_number(stats["running_alert_seconds"]),
        )
        age = 0.0 if oldest is None else max(0.0, self.reads.clock.now() - oldest)
        yield GaugeMetricFamily(
            "harness_oldest_running_step_age_seconds",
            "Age of the oldest step RUNNING in a run still moving; 0 if none.",
            value=age,
        )
        swept = stats["last_sweep_age_s"]
        yield GaugeMetricFamily(
            "harness_last_sweep_age_seconds",
            "Seconds since the last sweep began, by beat or a worker; +Inf if none recorded.",
            value=math.inf if swept is None else _number(swept),
        )
        yield from _wait_metrics(stats)


def _wait_metrics(stats: dict[str, JSON]) -> Iterator[Metric]:
    """Runs that wait on the world: deferred calls by what they wait for,
    signals kept, timeouts and children started, the oldest wait's age."""
    deferred = GaugeMetricFamily(
        "harness_deferred_steps",
        "Deferred calls of runs not ended, by what they wait for.",
        labels=["kind"],
    )
    kinds = stats["deferred_steps"]
    assert isinstance(kinds, dict)
    for kind in WaitKind:
        deferred.add_metric([kind.value], _number(kinds.get(kind.value, 0)))
    yield deferred
    yield GaugeMetricFamily(
        "harness_signals_kept",
        "Signals (and early answers) kept until a step asks for them.",
        value=_number(stats["signals_kept"]),
    )
    yield CounterMetricFamily(
        "harness_wait_timeouts",
        "Deferred calls answered by their timeout (an error the model sees).",
        value=_number(stats["wait_timeouts"]),
    )
    yield CounterMetricFamily(
        "harness_children_started",
        "Child runs started by a parent's call (harness.agent_tool, ctx.start_child).",
        value=_number(stats["children_started"]),
    )
    oldest = stats["oldest_wait_s"]
    yield GaugeMetricFamily(
        "harness_oldest_wait_age_seconds",
        "Seconds the oldest deferred call of a waiting run has waited; 0 if none.",
        value=0.0 if oldest is None else _number(oldest),
    )


def _number(value: object) -> float:
    assert isinstance(value, int | float)
    return float(value)


def exposition(reads: Reads, settings: Settings) -> tuple[bytes, str]:
    """The body of ``GET /metrics`` and its content type: the store's counts,
    and the worker metrics of ``settings.metrics_dir`` when it is set."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(reads))
    _add_worker_files(registry, settings.metrics_dir)
    return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4


def _add_worker_files(registry: CollectorRegistry, directory: Path | None) -> None:
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]


# -- worker processes ------------------------------------------------------


STEPS = CounterFile(
    "harness_steps",
    "Step executions recorded, by step kind and outcome (done, failed, in_doubt).",
    ("kind", "outcome"),
)
STEP_SECONDS = HistogramFile(
    "harness_step_duration_seconds",
    "From a step's claim to the commit of its result, by kind and outcome.",
    ("kind", "outcome"),
    STEP_BUCKETS,
)
WRITE_SECONDS = HistogramFile(
    "harness_checkpoint_duration_seconds",
    "Checkpoint writes, by phase: running (before a step), result (after), other.",
    ("phase",),
    WRITE_BUCKETS,
)
TOKENS = CounterFile(
    "harness_model_tokens",
    "Tokens the provider reported for recorded model steps, by model and direction.",
    ("model", "direction"),
)
COST = CounterFile(
    "harness_model_cost_usd",
    "Price of the recorded model steps (HARNESS_PRICES), by model.",
    ("model",),
)
PHASES = ("running", "result", "other")

#: This process's files while it measures, and the process that opened them.
_files: SlotFiles | None = None
_pid = 0
_lock = threading.Lock()


def slot_identifier(node: str, slot: int | str) -> str:
    """The file-name part of a pool slot: stable across the children that
    fill it in turn, distinct between the slots of a host's workers."""
    return re.sub(r"[^A-Za-z0-9.@-]", "-", f"{node}-{slot}")


def start_worker_process(settings: Settings, identifier: str) -> bool:
    """Measure steps in this process into ``settings.metrics_dir``, in files
    named after ``identifier`` (:func:`slot_identifier`), or after a spare
    name if a live process holds that one (:class:`files.SlotFiles`). Call
    it once the process will not fork again (a pool child at start, a solo
    worker); a second call changes nothing, and a process forked from a
    measuring one starts afresh instead of writing its parent's files.

    False, and nothing measured here, without a directory or when the
    directory cannot hold the files (full, read-only, not a directory): one
    warning, and the worker runs on unmeasured. The files' pages are all
    allocated here, with every known label set written at zero, so that a
    disk filling up later cannot kill the process (SIGBUS) on a write to a
    page of a mapped file; prometheus_client's own globals and
    ``PROMETHEUS_MULTIPROC_DIR`` are left alone."""
    global _files, _pid
    if settings.metrics_dir is None:
        return False
    with _lock:
        if _files is not None:
            if _pid == os.getpid():
                return True
            _files.close()  # the parent's, inherited by fork: its lock stays the parent's
            _files = None
        try:
            files = SlotFiles(settings.metrics_dir, identifier)
        except OSError as err:
            log.warning(
                "metrics: off in this process, %s cannot hold its files: %s",
                settings.metrics_dir,
                err,
            )
            return False
        try:
            _create_known_label_sets(files)
        except OSError as err:
            files.close()
            log.warning(
                "metrics: off in this process, %s cannot hold its files: %s",
                settings.metrics_dir,
                err,
            )
            return False
        _files, _pid = files, os.getpid()
    log.info("metrics: this process writes %s/*_%s.db", settings.metrics_dir, files.identifier)
    return True


def _create_known_label_sets(files: SlotFiles) -> None:
    """Write every label set known in advance at zero: their pages are then
    allocated before any step commits. (Model names are not known: a new
    one's samples are given room when first counted, see SlotFiles.)"""
    for kind in StepKind:
        for outcome in sorted(RESULTS):
            STEPS.create(files, (kind.value, outcome))
            STEP_SECONDS.create(files, (kind.value, outcome))
    for phase in PHASES:
        WRITE_SECONDS.create(files, (phase,))


def stop_worker_process() -> None:
    """Stop measuring here and close the files (tests; a process shutting down)."""
    global _files
    with _lock:
        if _files is not None and _pid == os.getpid():
            _files.close()
        _files = None


def enabled() -> bool:
    """This process measures steps (:func:`start_worker_process` ran)."""
    return _files is not None and _pid == os.getpid()


def checkpoint_written(
    checkpoint: Checkpoint, kind: str | None, duration: float | None, write: float
) -> None:
    """Count what a committed checkpoint did: its write's duration, and a
    step result's outcome and duration. No-op unless measuring."""
    files = _files
    if files is None:
        return
    phase = "other"
    for event in checkpoint.events:
        if event.step_index is None:
            continue
        if event.to_status == StepStatus.RUNNING.value:
            phase = "running"
        elif event.to_status in RESULTS:
            phase = "result"
            labels = (kind or "unknown", str(event.to_status))
            STEPS.inc(files, labels)
            if duration is not None:
                STEP_SECONDS.observe(files, labels, duration)
    WRITE_SECONDS.observe(files, (phase,), write)


def model_usage(model: str, usage: Usage, cost_usd: float | None) -> None:
    """Count the tokens (and cost) of a model step whose result was recorded."""
    files = _files
    if files is None:
        return
    TOKENS.inc(files, (model, "input"), usage.input_tokens)
    TOKENS.inc(files, (model, "output"), usage.output_tokens)
    if cost_usd:
        COST.inc(files, (model,), cost_usd)


def serve(settings: Settings) -> bool:
    """Serve ``settings.metrics_dir`` on ``settings.metrics_port`` from this
    process (a worker's main process: its children's files), for a host
    where no API runs. False if not configured."""
    if settings.metrics_dir is None or settings.metrics_port is None:
        return False
    registry = CollectorRegistry(auto_describe=False)
    _add_worker_files(registry, settings.metrics_dir)
    start_http_server(settings.metrics_port, registry=registry)
    log.info("metrics: serving %s on port %d", settings.metrics_dir, settings.metrics_port)
    return True
