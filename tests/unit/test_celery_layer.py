"""The Celery layer: the library never imports it, importing it does nothing, and
the configuration, queues and sweeper are the library's."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.worker.request import Request
from kombu import Connection, Message, Queue

from harness import api, compose
from harness import celery as harness_celery
from harness.celery import health, sweeper
from harness.celery.config import (
    QUEUE,
    RECOVERY_QUEUE,
    SCHEDULER,
    STEP_TASK,
    SWEEP_TASK,
    celery_settings,
    make_sender,
)
from harness.engine.hints import ClaimHint
from harness.engine.runtime import Sender
from harness.engine.taskresult import TaskResult
from harness.errors import ConfigError
from harness.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=base | {"PYTHONPATH": str(REPO)} | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_library_does_not_import_the_celery_app(tmp_path: Path) -> None:
    code = (
        "import sys, json, harness, harness.api, harness.cli;"
        "print(json.dumps(sorted({'tasks', 'celeryconfig'} & set(sys.modules))))"
    )
    assert json.loads(_python(code, tmp_path)) == []


def test_importing_the_app_reads_no_variable_and_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    invalid = {
        "HARNESS_HOME": str(home),
        "HARNESS_LEASE_TTL": "not a number",
        "HARNESS_SWEEP_INTERVAL": "-1",
        "HARNESS_WORKER_POOL": "gevent",
    }
    code = (
        "import tasks, celeryconfig\n"
        "try:\n"
        "    tasks.app.conf.broker_url\n"
        "except Exception as err:\n"
        "    print(type(err).__name__)\n"
    )
    # The error comes when Celery first reads its configuration, not at import.
    assert _python(code, tmp_path, invalid).split() == ["ConfigError"]
    assert not home.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_mapping_creates_no_folder_and_the_transport_does(tmp_path: Path) -> None:
    settings = Settings.from_env({"HARNESS_HOME": str(tmp_path / "home")})
    conf = celery_settings(settings)
    assert not settings.broker_dir.exists()
    with Connection(
        settings.broker_url,
        transport=conf["broker_transport"],
        transport_options=conf["broker_transport_options"],
    ) as conn:
        conn.default_channel  # noqa: B018 - opening the channel is the point
    for sub in ("queue", "staging", "claimed", "control"):
        assert (settings.broker_dir / sub).is_dir()


@pytest.mark.parametrize("broker", ["filesystem://", "redis://r:6379/0", "amqp://g@r//"])
def test_every_worker_consumes_the_recovery_lane_first(broker: str) -> None:
    conf = celery_settings(Settings.from_env({"HARNESS_BROKER_URL": broker}))
    assert [q.name for q in conf["task_queues"]] == [RECOVERY_QUEUE, QUEUE]
    assert {q.routing_key for q in conf["task_queues"]} == {RECOVERY_QUEUE, QUEUE}
    assert conf["task_default_queue"] == QUEUE
    if broker.startswith("redis"):
        assert conf["broker_transport_options"]["queue_order_strategy"] == "priority"
    if broker.startswith("amqp"):
        assert all(q.queue_arguments == {"x-queue-type": "quorum"} for q in conf["task_queues"])


def test_beat_sweeps_in_process_and_a_sent_sweep_expires() -> None:
    conf = celery_settings(Settings.from_env({"HARNESS_SWEEP_INTERVAL": "7"}))
    assert conf["beat_scheduler"] == SCHEDULER
    assert conf["beat_schedule"]["harness-sweep"] == {"task": SWEEP_TASK, "schedule": 7.0}
    assert conf["task_routes"][SWEEP_TASK] == {"queue": RECOVERY_QUEUE}
    assert conf["task_annotations"][SWEEP_TASK] == {"expires": 7.0}


def test_the_scheduler_runs_the_sweep_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the runtime that install() hands over (beat builds the scheduler by name)."""
    calls: list[object] = []
    rt = object()
    monkeypatch.setattr(sweeper, "sweep", lambda on: calls.append(on) or 0)
    app = Celery("beat-test", set_as_current=False, broker="memory://")
    scheduler = sweeper.Scheduler(app, lazy=True)
    entry = ScheduleEntry(name="harness-sweep", task=SWEEP_TASK, schedule=1.0, app=app)
    monkeypatch.setattr(sweeper, "_runtime", None)
    scheduler.apply_entry(entry)  # no app installed: said, and nothing swept
    assert calls == []
    monkeypatch.setattr(sweeper, "_runtime", lambda: rt)
    monkeypatch.setattr(sweeper, "_settings", lambda: Settings.from_env({}))
    scheduler.apply_entry(entry)
    assert calls == [rt]

    def broken(on: object) -> int:
        raise RuntimeError("store down")

    monkeypatch.setattr(sweeper, "sweep", broken)
    scheduler.apply_entry(entry)  # logged; beat carries on


def test_the_runtime_sends_through_the_injected_sender(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compose, "_sender_factory", compose._sender_factory)
    sent: list[tuple[str, int, bool]] = []

    def factory(settings: Settings) -> Sender:
        def send(run_id: str, cursor: int, *, recovery: bool = False, **_: object) -> None:
            sent.append((run_id, cursor, recovery))

        return send

    api.use_sender(factory)
    api.reset_runtime()
    api.runtime().dispatch("r1", 3, recovery=True)
    assert sent == [("r1", 3, True)]


def test_the_default_sender_uses_the_recovery_lane(tmp_path: Path) -> None:
    settings = Settings.from_env({"HARNESS_HOME": str(tmp_path)})
    send = make_sender(settings)
    send("r1", 0)
    send("r1", 1, recovery=True)
    names = sorted(p.name.split(".", 1)[1] for p in (settings.broker_dir / "queue").iterdir())
    assert names == [f"{QUEUE}.msg", f"{RECOVERY_QUEUE}.msg"]


def test_the_app_injects_a_sender_bound_to_itself(tmp_path: Path) -> None:
    """In a process running the app, steps go out through the app's producer pool;
    for other settings (the environment changed since), through a client of their own."""
    code = (
        "import json, tasks\n"
        "from harness import api\n"
        "from harness.settings import Settings\n"
        "rt = api.runtime()\n"
        "rt.dispatch('r1', 0)\n"
        "rt.dispatch('r1', 1, recovery=True)\n"
        "pooled = tasks.app._pool is not None\n"
        "tasks.sender(Settings.from_env({'HARNESS_HOME': 'elsewhere'}))('r2', 0)\n"
        "print(json.dumps(pooled))\n"
    )
    assert json.loads(_python(code, tmp_path, {"HARNESS_HOME": str(tmp_path / "home")}))
    queued = sorted(p.name.split(".", 1)[1] for p in (tmp_path / "home/broker/queue").iterdir())
    assert queued == [f"{QUEUE}.msg", f"{RECOVERY_QUEUE}.msg"]
    assert len(list((tmp_path / "elsewhere/broker/queue").iterdir())) == 1


def _shop_app() -> Celery:
    """An app configured unlike ours: its own queue, routes, serializer, schedule."""
    app = Celery("shop", set_as_current=False)
    app.conf.update(
        broker_url="redis://r:6379/0",
        task_serializer="pickle",
        accept_content=["pickle"],
        task_default_queue="shop",
        task_routes={"shop.*": {"queue": "shop"}},
        beat_schedule={"restock": {"task": "shop.restock", "schedule": 60}},
        imports=("shop.tasks",),
    )
    return app


def test_install_keeps_the_apps_own_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_IMPORTS", "shop.agents")
    monkeypatch.setenv("HARNESS_SWEEP_INTERVAL", "3")
    app = _shop_app()
    installed = harness_celery.install(app, queue="agents")
    conf = app.conf
    assert [q.name for q in conf.task_queues] == ["shop", "agents.recovery", "agents"]
    route = app.amqp.router.route
    assert route({}, "shop.pack")["queue"].name == "shop"
    assert route({}, STEP_TASK)["queue"].name == "agents"
    assert route({}, SWEEP_TASK)["queue"].name == "agents.recovery"
    assert conf.task_serializer == "pickle" and conf.accept_content == ["pickle", "json"]
    assert set(conf.beat_schedule) == {"restock", "harness-sweep"}
    assert conf.beat_schedule["harness-sweep"]["schedule"] == 3.0
    assert conf.beat_scheduler == SCHEDULER
    assert conf.imports == ("shop.tasks", "shop.agents")
    app.finalize()
    step = app.tasks[STEP_TASK]
    assert (step.serializer, step.acks_late, step.ignore_result) == ("json", True, True)
    assert step.time_limit == Settings.from_env().task_time_limit
    assert installed.run_step.name == STEP_TASK


def test_an_apps_annotations_cannot_loosen_the_step_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _shop_app()
    app.conf.update(
        task_soft_time_limit=30,
        task_annotations={
            "*": {
                "acks_late": False,
                "reject_on_worker_lost": False,
                "max_retries": 0,
                "serializer": "pickle",
                "rate_limit": "10/m",
                "soft_time_limit": 5,
            }
        },
    )
    harness_celery.install(app, queue="agents")
    app.finalize()
    step = app.tasks[STEP_TASK]
    pinned = {name: getattr(step, name) for name in harness_celery.STEP_GUARANTEES}
    assert pinned == harness_celery.STEP_GUARANTEES
    limit = Settings.from_env().task_time_limit
    assert step.time_limit == step.soft_time_limit == limit  # no soft limit of 30 or 5
    harness_celery._check_the_step_task(app)  # nothing to say
    assert not caplog.records
    step.acks_late = False  # as if loosened where no annotation reaches
    harness_celery._check_the_step_task(app)
    assert "acks_late=False" in caplog.text


def test_queues_built_before_install_get_the_step_queues_too() -> None:
    app = _shop_app()
    app.conf.task_queues = [Queue("shop")]
    assert set(app.amqp.queues) == {"shop"}  # built, and cached, before the install
    harness_celery.install(app, queue="agents")
    assert set(app.amqp.queues) == {"shop", "agents", "agents.recovery"}


def test_an_app_without_queues_keeps_celerys_default_one() -> None:
    app = Celery("plain", set_as_current=False, broker="memory://")
    harness_celery.install(app, queue="agents")
    assert [q.name for q in app.conf.task_queues] == ["celery", "agents.recovery", "agents"]


def test_an_app_with_a_scheduler_of_its_own_gets_the_sweep_as_a_message() -> None:
    app = _shop_app()
    app.conf.beat_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"
    harness_celery.install(app, queue="agents")
    assert app.conf.beat_scheduler == "django_celery_beat.schedulers:DatabaseScheduler"
    assert app.conf.beat_schedule["harness-sweep"]["task"] == SWEEP_TASK


def test_a_worker_of_the_step_queue_consumes_its_recovery_lane() -> None:
    app = _shop_app()
    harness_celery.install(app, queue="agents")
    app.amqp.queues.select(["shop", "agents"])
    harness_celery.consume_the_recovery_lane(app, "agents")
    assert list(app.amqp.queues.consume_from) == ["shop", "agents.recovery", "agents"]
    app.amqp.queues.select(["shop"])  # a worker of the shop's queue alone: left alone
    harness_celery.consume_the_recovery_lane(app, "agents")
    assert list(app.amqp.queues.consume_from) == ["shop"]


def test_a_step_message_carries_the_run_and_cursor_only(tmp_path: Path) -> None:
    settings = Settings.from_env({"HARNESS_HOME": str(tmp_path), "HARNESS_QUEUE": "agents"})
    make_sender(settings)("r1", 3, recovery=True)
    (path,) = (settings.broker_dir / "queue").iterdir()
    assert path.name.endswith(".agents.recovery.msg")
    message = json.loads(path.read_text())
    assert message["content-type"] == "application/json"
    assert message["headers"]["argsrepr"] == "run=r1"  # what Flower shows
    assert message["headers"]["kwargsrepr"] == "cursor=3 (recovery)"
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert (args, kwargs) == (["r1"], {"cursor": 3})


def test_beat_refreshes_its_heartbeat_after_each_sweep(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    beat_file = tmp_path / "beat.heartbeat"
    monkeypatch.setattr(sweeper, "sweep", lambda on: 0)
    monkeypatch.setattr(sweeper, "_runtime", object)
    monkeypatch.setattr(sweeper, "_settings", Settings.from_env)  # as each sweep goes
    app = Celery("beat-test", set_as_current=False, broker="memory://")
    scheduler = sweeper.Scheduler(app, lazy=True)
    entry = ScheduleEntry(name="harness-sweep", task=SWEEP_TASK, schedule=1.0, app=app)
    scheduler.apply_entry(entry)
    assert not beat_file.exists()  # not asked for: nothing written
    monkeypatch.setenv("HARNESS_WORKER_HEARTBEAT_FILE", str(beat_file))
    scheduler.apply_entry(entry)
    assert health.check(beat_file).healthy


def test_a_queue_name_the_brokers_and_celery_cli_cannot_take_is_refused() -> None:
    with pytest.raises(ConfigError, match="HARNESS_QUEUE"):
        Settings.from_env({"HARNESS_QUEUE": "agents,shop"})
    assert Settings.from_env({"HARNESS_QUEUE": "agents"}).queue == "agents"


def test_a_claim_hint_travels_in_a_header_to_the_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run and the cursor stay the message's only arguments; the hint is a
    header, which Celery hands to the task as the worker's pool executes it."""
    settings = Settings.from_env({"HARNESS_HOME": str(tmp_path)})
    hint = ClaimHint(5, "agent", "tool", 0)
    make_sender(settings)("r1", 3, hint=hint)
    (path,) = (settings.broker_dir / "queue").iterdir()
    raw = json.loads(path.read_text())
    assert raw["headers"][ClaimHint.HEADER] == [5, "agent", "tool", 0]
    body = base64.b64decode(raw["body"])
    args, kwargs, _ = json.loads(body)
    assert (args, kwargs) == (["r1"], {"cursor": 3})

    monkeypatch.setattr(compose, "_sender_factory", compose._sender_factory)
    app = Celery("hint-test", broker="memory://", set_as_current=False)
    installed = harness_celery.install(app)
    seen: list[tuple[str, int | None, ClaimHint | None]] = []

    def run_step(rt: object, run_id: str, cursor: int | None, hint: ClaimHint | None) -> TaskResult:
        seen.append((run_id, cursor, hint))
        return TaskResult.ADVANCED

    monkeypatch.setattr(harness_celery.runner, "run_step", run_step)
    monkeypatch.setattr(harness_celery.compose, "runtime", lambda: None)
    for headers in (
        raw["headers"],
        {k: v for k, v in raw["headers"].items() if k != "harness_claim"},
    ):
        message = Message(
            body=body,
            headers=headers,
            content_type="application/json",
            content_encoding="utf-8",
        )
        Request(message, app=app, task=installed.run_step).execute()
    assert seen == [("r1", 3, hint), ("r1", 3, None)]
