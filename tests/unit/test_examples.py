"""The examples run as documented: the offline one on its scripted model, the
real-provider one through the OpenAI SDK against the local wire-format server."""

from __future__ import annotations

import importlib

from harness.engine.creation import create_run
from harness.engine.operations import decide
from harness.records import RunStatus, StepStatus
from harness.store.sql import SQLStore
from tests.rig import Rig
from tests.wire import WireServer

GOAL = "What should I wear in Oslo and in Lisbon today?"


def test_the_offline_example(sqlite_store: SQLStore) -> None:
    importlib.import_module("examples.offline")
    rig = Rig(sqlite_store)
    run_id = create_run(rig.runtime(), "weather-offline", GOAL)
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED
    assert [s.result["sky"] for s in sqlite_store.steps(run_id)[1:3]] == ["snow", "sunny"]


def test_the_real_provider_example(sqlite_store: SQLStore, wire: WireServer) -> None:
    wire.script(
        GOAL,
        [
            {
                "tool_calls": [
                    {"name": "current_weather", "args": {"city": "Oslo"}},
                    {"name": "current_weather", "args": {"city": "Atlantis"}},
                ]
            },
            {"text": "A coat for Oslo; I have no weather for Atlantis."},
        ],
    )
    importlib.reload(importlib.import_module("examples.weather"))  # built with this env
    rig = Rig(sqlite_store)
    run_id = create_run(rig.runtime(), "weather", GOAL)
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    steps = sqlite_store.steps(run_id)
    assert steps[2].status is StepStatus.FAILED  # the unknown city went back as an error
    first = wire.requests[0].body
    assert first["model"] == "gpt-4.1-mini"
    assert first["messages"][0]["role"] == "system"
    assert first["tools"][0]["function"]["name"] == "current_weather"


def test_the_approvals_example(sqlite_store: SQLStore) -> None:
    importlib.import_module("examples.approvals")
    rig = Rig(sqlite_store)
    run_id = create_run(rig.runtime(), "refunds", "refund orders 1234 and 5678")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.WAITING
    assert sqlite_store.steps(run_id)[1].status is StepStatus.AWAITING_APPROVAL
    rt = rig.runtime()
    decide(rt, run_id, approve=True, who="alice")
    decide(rt, run_id, approve=False, who="alice", step_index=2, reason="ask first")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert sqlite_store.steps(run_id)[2].error == "rejected by alice: ask first"
