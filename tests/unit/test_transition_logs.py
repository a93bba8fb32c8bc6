"""One log line per transition, through the logging module: text by default,
JSON with HARNESS_LOG_FORMAT=json, in Celery's handlers too."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import after_setup_logger, after_setup_task_logger

import harness
from harness.celery import hooks
from harness.engine.creation import create_run
from harness.observability import logs
from harness.records import StepKind
from harness.settings import Settings
from harness.store.memory import MemoryStore
from tests.rig import Rig


@harness.tool(effect="idempotent")
def stamp(n: int) -> dict[str, int]:
    return {"n": n}


AGENT = "obs-logs"
harness.register_agent(
    harness.Agent(
        name=AGENT,
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "stamp", "args": {"n": 1}}]}, {"final": "stamped"}]
        ),
        tools=[stamp],
    )
)
FIELDS = ("run_id", "step", "kind", "from", "to", "version", "worker", "duration", "write")


@pytest.fixture
def rig(memory_store: MemoryStore) -> Rig:
    return Rig(memory_store)


def _transitions(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        getattr(r, logs.FIELDS)
        for r in caplog.records
        if r.name == logs.TRANSITIONS and r.levelno == logging.INFO
    ]


def test_every_recorded_transition_is_logged_once_with_its_fields(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=logs.TRANSITIONS)
    run_id = create_run(rig.runtime(), AGENT, "stamp once")
    rig.drive()
    lines = _transitions(caplog)
    events = rig.store.events(run_id)
    assert [(f["step"], f["from"], f["to"], f["version"]) for f in lines] == [
        (e.step_index, e.from_status, e.to_status, e.version) for e in events
    ]
    kinds = {s.index: s.kind for s in rig.store.steps(run_id)}
    for fields in lines:
        assert set(FIELDS) <= set(fields)
        assert fields["run_id"] == run_id
        assert fields["worker"].startswith("w1")  # a claim's: w1/<this execution>
        assert fields["kind"] == (None if fields["step"] is None else kinds[fields["step"]])
    results = [f for f in lines if f["to"] == "done"]
    assert {f["kind"] for f in results} == {StepKind.MODEL, StepKind.TOOL}
    # A result has the step's duration (a hand-moved clock: zero) and the write's.
    assert all(f["duration"] is not None and f["duration"] >= 0 for f in results)
    assert all(f["write"] is not None and f["write"] >= 0 for f in lines[1:])
    claim = next(f for f in lines if f["to"] == "running" and f["step"] is not None)
    assert claim["duration"] is None  # nothing executed yet


def test_the_text_line_reads_on_one_line(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=logs.TRANSITIONS)
    run_id = create_run(rig.runtime(), AGENT, "stamp once")
    rig.drive()
    messages = [r.getMessage() for r in caplog.records if r.name == logs.TRANSITIONS]
    tool_done = re.compile(
        rf"run={run_id} step=1 kind=tool v=\d+ running -> done worker=w1 "
        r"duration=\d+\.\d{3}s write=\d+\.\d{3}s"
    )
    assert any(tool_done.fullmatch(m) for m in messages), messages
    assert messages[0] == f"run={run_id} step=- v=1 - -> pending worker=w1 (agent={AGENT})"
    assert all("\n" not in m for m in messages)


def test_no_line_is_built_when_info_is_off(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=logs.TRANSITIONS)
    create_run(rig.runtime(), AGENT, "quiet")
    rig.drive()
    assert _transitions(caplog) == []


def _record(**extra: Any) -> logging.LogRecord:
    record = logging.getLogger("harness.test").makeRecord(
        "harness.test", logging.WARNING, __file__, 1, "hello %s", ("world",), None, extra=extra
    )
    return record


def test_json_lines_carry_the_fields_and_parse() -> None:
    fields = {
        "run_id": "r1",
        "step": 2,
        "kind": "tool",
        "from": "running",
        "to": "done",
        "version": 7,
        "worker": "w",
        "duration": 0.5,
        "write": 0.001,
    }
    line = logs.JsonFormatter().format(_record(**{logs.FIELDS: fields}, task_id="t-1"))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "WARNING"
    assert parsed["logger"] == "harness.test"
    assert parsed["message"] == "hello world"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", parsed["ts"])
    assert {k: parsed[k] for k in fields} == fields
    assert parsed["task_id"] == "t-1"


def test_json_leaves_out_uvicorns_coloured_copy_of_the_message() -> None:
    record = _record(color_message="\x1b[32mhello\x1b[0m %s", request_id="q-1")
    parsed = json.loads(logs.JsonFormatter().format(record))
    assert "color_message" not in parsed
    assert parsed["request_id"] == "q-1"  # other extras are kept


def test_json_keeps_a_traceback_on_its_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info()
        )
    parsed = json.loads(logs.JsonFormatter().format(record))
    assert "ValueError: boom" in parsed["exc_info"]


@contextlib.contextmanager
def bare_root() -> Iterator[logging.Logger]:
    """The root logger without pytest's handlers, restored afterwards."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers = []
    try:
        yield root
    finally:
        root.handlers = saved
        root.setLevel(level)


def test_configure_writes_json_when_asked() -> None:
    with bare_root() as root:
        logs.configure(Settings.from_env({"HARNESS_LOG_FORMAT": "json"}))
        logs.configure(Settings.from_env({"HARNESS_LOG_FORMAT": "json"}))  # idempotent
        handlers = root.handlers[:]
    assert len(handlers) == 1
    assert isinstance(handlers[0].formatter, logs.JsonFormatter)


def test_configure_is_text_by_default() -> None:
    with bare_root() as root:
        logs.configure(Settings.from_env({}))
        handlers = root.handlers[:]
    assert len(handlers) == 1
    assert not isinstance(handlers[0].formatter, logs.JsonFormatter)


def test_celery_hooks_make_celerys_handlers_json(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks.install_celery_hooks(Settings.from_env)  # the settings as the signal fires
    hooks.install_celery_hooks(Settings.from_env)
    ours = [r for r in after_setup_logger.receivers if "harness.celery.hooks" in str(r[0])]
    assert len(ours) == 1
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("celery-like")
    logger.addHandler(handler)
    try:
        after_setup_task_logger.send(sender=None, logger=logger)  # text: left alone
        assert not isinstance(handler.formatter, logs.JsonFormatter)
        monkeypatch.setenv("HARNESS_LOG_FORMAT", "json")
        after_setup_logger.send(sender=None, logger=logger)
        logger.warning("ready")
    finally:
        logger.removeHandler(handler)
    assert json.loads(stream.getvalue())["message"] == "ready"


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(harness.errors.ConfigError, match="HARNESS_LOG_FORMAT"):
        Settings.from_env({"HARNESS_LOG_FORMAT": "xml"})
