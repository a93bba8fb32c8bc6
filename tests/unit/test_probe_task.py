"""The sweeper's delivery probes travel as the step message they always were,
down the same queues, under a task name of their own (``tasks.probe``), so a
Flower search for ``name:run_step`` leaves them out. The worker that takes
one off notes the lane delivered, as before (harness.engine.probes)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.worker.request import Request
from flower.utils.search import TaskSearchEngine
from kombu import Message

from harness import celery as harness_celery
from harness import compose
from harness.celery.config import PROBE_TASK, QUEUE, RECOVERY_QUEUE, STEP_TASK, make_sender
from harness.engine import probes
from harness.settings import Settings
from harness.store import Lane
from harness.store.sql import SQLStore
from tests.rig import Rig


def _queued(settings: Settings) -> list[dict[str, Any]]:
    folder = settings.broker_dir / "queue"
    return [json.loads(p.read_text()) for p in sorted(folder.iterdir(), key=lambda p: p.name)]


def test_a_probe_is_a_step_message_under_the_probe_task_name(tmp_path: Path) -> None:
    settings = Settings.from_env({"HARNESS_HOME": str(tmp_path)})
    send = make_sender(settings)
    probe = probes.probe_id(probes.NORMAL, 1234.5)
    send("r1", 3)
    send(probe, 0)
    send(probes.probe_id(probes.RECOVERY, 1234.5), 0, recovery=True)
    messages = {m["headers"]["argsrepr"]: m for m in _queued(settings)}
    step, normal = messages["run=r1"], messages[f"run={probe}"]
    assert (step["headers"]["task"], normal["headers"]["task"]) == (STEP_TASK, PROBE_TASK)
    assert normal["headers"]["kwargsrepr"] == "cursor=0"
    assert json.loads(base64.b64decode(normal["body"]))[:2] == [[probe], {"cursor": 0}]
    # The same lanes as the steps they vouch for.
    lanes = {p.name.split(".", 1)[1] for p in (settings.broker_dir / "queue").iterdir()}
    assert lanes == {f"{QUEUE}.msg", f"{RECOVERY_QUEUE}.msg"}


def test_flower_can_leave_the_probes_out(tmp_path: Path) -> None:
    """Flower's task list search (flower.utils.search), on the tasks as its
    events name them: the task name, and the arguments as the message shows them."""
    settings = Settings.from_env({"HARNESS_HOME": str(tmp_path)})
    send = make_sender(settings)
    send("r1", 0)
    send("r1", 1, recovery=True)
    send(probes.probe_id(probes.NORMAL, 10.0), 0)
    tasks = {
        str(i): SimpleNamespace(
            uuid=str(i),
            name=m["headers"]["task"],
            state="SUCCESS",
            worker=None,
            args=m["headers"]["argsrepr"],
            kwargs=m["headers"]["kwargsrepr"],
            result=None,
            timestamp=float(i),
            received=None,
        )
        for i, m in enumerate(_queued(settings))
    }
    engine = TaskSearchEngine()
    engine.rebuild(tasks.items())

    def found(query: str) -> list[str]:
        return sorted(str(tasks[i].args) for i in engine.search(tasks, query).task_ids)

    assert found("name:run_step") == ["run=r1", "run=r1"]
    assert found("name:probe") == ["run=harness.probe:normal:10.0"]


def test_a_worker_notes_the_lane_delivered_when_it_takes_a_probe_off(
    sqlite_store: SQLStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env({"HARNESS_HOME": str(tmp_path)})
    make_sender(settings)(probes.probe_id(probes.NORMAL, 77.0), 0)
    (raw,) = _queued(settings)
    monkeypatch.setattr(compose, "_sender_factory", compose._sender_factory)
    app = Celery("probe-test", broker="memory://", set_as_current=False)
    installed = harness_celery.install(app)
    assert installed.probe is not None and installed.probe.name == PROBE_TASK
    assert app.tasks[PROBE_TASK].acks_late and app.tasks[PROBE_TASK].reject_on_worker_lost
    rig = Rig(sqlite_store)
    monkeypatch.setattr(harness_celery.compose, "runtime", rig.runtime)
    message = Message(
        body=base64.b64decode(raw["body"]),
        headers=raw["headers"],
        content_type="application/json",
        content_encoding="utf-8",
    )
    Request(message, app=app, task=installed.probe).execute()
    assert sqlite_store.lanes() == {probes.NORMAL: Lane(None, 77.0)}
