"""The agent catalog (harness.catalog): the definition hash, what a worker
publishes, the live listing and its mixed releases, and the rule that a run
may be created for an agent registered here or carried by a live worker."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import harness
import tests.agents  # noqa: F401 - registers 'chain'
from harness import agents, catalog
from harness.agents import Agent, register_agent
from harness.catalog import LIVE, Publisher
from harness.engine.creation import create_run
from harness.errors import AgentNotFound
from harness.records import RunStatus
from harness.store import PublishedAgent, PublishedTool, RunQuery
from harness.store.sql import SQLStore
from tests.rig import FakeClock, Rig

REPO = Path(__file__).resolve().parents[2]
TURNS: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "pay", "args": {"amount": 1}}]},
    {"final": "paid"},
]


@harness.tool(effect="at_most_once", requires_approval=True)
def pay(amount: int) -> str:
    """Pay someone."""
    return f"paid {amount}"


@harness.tool(effect="read_only")
def look(query: str) -> str:
    return query


def payer(**changes: Any) -> Agent:
    fields: dict[str, Any] = {
        "name": "payer",
        "model": harness.ScriptedModel(TURNS),
        "tools": [pay, look],
        "max_steps": 10,
    }
    return Agent(**(fields | changes))


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, Agent]:
    """An empty agent registry for the test."""
    empty: dict[str, Agent] = {}
    monkeypatch.setattr(agents, "_AGENTS", empty)
    return empty


# -- the definition hash ---------------------------------------------------------------


def test_the_definition_names_the_agent_its_model_tools_and_limits() -> None:
    described = catalog.definition(payer())
    assert set(described) == {"name", "model", "tools", "limits"}
    assert described["name"] == "payer"
    assert described["model"] == {
        "class": "harness.models.ScriptedModel",
        "turns": [
            {"tool_calls": [{"name": "pay", "args": {"amount": 1}}]},
            {"final": "paid"},
        ],
    }
    pay_tool, look_tool = described["tools"]  # type: ignore[misc]
    assert pay_tool["name"] == "pay" and pay_tool["effect"] == "at_most_once"
    assert pay_tool["requires_approval"] is True and pay_tool["description"] == "Pay someone."
    assert pay_tool["schema"]["properties"]["amount"]["type"] == "integer"
    assert look_tool["effect"] == "read_only" and look_tool["requires_approval"] is False
    limits = described["limits"]
    assert isinstance(limits, dict)
    assert limits["max_steps"] == 10 and limits["on_budget"] == "fail"
    assert {"max_attempts", "deadline", "max_tokens", "max_cost_usd"} <= set(limits)


def test_equal_definitions_hash_alike_in_another_process() -> None:
    mine = catalog.definition_hash(agents.get_agent("chain"))
    assert mine.startswith("sha256:") and len(mine) == len("sha256:") + 64
    assert catalog.definition_hash(payer()) == catalog.definition_hash(payer())
    script = (
        "import tests.agents\n"
        "from harness import agents, catalog\n"
        "print(catalog.definition_hash(agents.get_agent('chain')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"}
    other = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert other.stdout.strip() == mine


@harness.tool(effect="at_most_once", requires_approval=True)
def pay_twice(amount: int, times: int = 2) -> str:
    """Pay someone."""
    return f"paid {amount} x{times}"


@pytest.mark.parametrize(
    "change",
    [
        {"name": "payer-2"},
        {"max_steps": 11},
        {"max_tokens": 5000},
        {"on_tool_error": "fail"},
        {"model": harness.ScriptedModel([{"final": "refused"}])},
        {"tools": [look]},
        {"tools": [harness.tool(effect="idempotent", name="pay")(pay.fn), look]},
        {"tools": [harness.tool(effect="at_most_once", name="pay")(pay.fn), look]},
        {
            "tools": [
                harness.tool(name="pay", effect="at_most_once", requires_approval=True)(
                    pay_twice.fn
                ),
                look,
            ]
        },
    ],
    ids=["name", "limit", "budget", "policy", "model", "tool-set", "effect", "approval", "schema"],
)
def test_what_changes_behaviour_changes_the_hash(change: dict[str, Any]) -> None:
    assert catalog.definition_hash(payer(**change)) != catalog.definition_hash(payer())


@harness.tool(effect="read_only")
def with_callback(callback: Callable[[int], int] | None = None) -> str:
    return "called"


@harness.tool(effect="read_only")
def with_other_callback(callback: Callable[[str], int] | None = None) -> str:
    return "called"


def test_a_tool_whose_arguments_have_no_json_schema_still_hashes() -> None:
    one = payer(tools=[with_callback])
    assert catalog.definition_hash(one) == catalog.definition_hash(payer(tools=[with_callback]))
    other = payer(tools=[harness.tool(name="with_callback")(with_other_callback.fn)])
    assert catalog.definition_hash(one) != catalog.definition_hash(other)


def test_a_provider_model_hashes_by_its_name_prompt_and_parameters() -> None:
    def hashed(*args: Any, **params: Any) -> str:
        return catalog.definition_hash(payer(model=harness.OpenAIModel(*args, **params)))

    brief = hashed("gpt-4.1-mini", system="Be brief.", temperature=0)
    assert brief == hashed("gpt-4.1-mini", system="Be brief.", temperature=0)
    assert brief != hashed("gpt-4.1", system="Be brief.", temperature=0)
    assert brief != hashed("gpt-4.1-mini", system="Be thorough.", temperature=0)
    assert brief != hashed("gpt-4.1-mini", system="Be brief.", temperature=1)


class ClientModel:
    """A model of one's own whose repr shows an object made in each process."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.client = object()

    def __repr__(self) -> str:
        return f"ClientModel(temperature={self.temperature}, client={self.client!r})"

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        return harness.ModelTurn(final="done")


def test_a_model_of_ones_own_hashes_by_its_repr_without_addresses() -> None:
    warm = catalog.definition_hash(payer(model=ClientModel(0.7)))
    assert warm == catalog.definition_hash(payer(model=ClientModel(0.7)))
    assert warm != catalog.definition_hash(payer(model=ClientModel(0.0)))


# -- the listing -----------------------------------------------------------------------


EFFECT = PublishedTool("effect", "idempotent", False)


def row(worker: str, agent: str, definition: str, started: float, seen: float) -> PublishedAgent:
    return PublishedAgent(worker, agent, definition, (EFFECT,), started, seen)


def test_the_listing_groups_workers_under_each_agent() -> None:
    rows = [
        row("w2@b", "chain", "sha256:aa", 10.0, 100.0),
        row("w1@a", "chain", "sha256:aa", 20.0, 101.0),
        row("w1@a", "alpha", "sha256:bb", 20.0, 101.0),
    ]
    alpha, chain = catalog.entries(rows)
    assert chain.to_dict() == {
        "name": "chain",
        "tools": [{"name": "effect", "effect": "idempotent", "requires_approval": False}],
        "definition_hash": "sha256:aa",
        "mixed_release": False,
        "workers": [
            {"name": "w1@a", "last_seen": 101.0, "definition_hash": "sha256:aa"},
            {"name": "w2@b", "last_seen": 100.0, "definition_hash": "sha256:aa"},
        ],
    }
    assert alpha.name == "alpha" and [w.name for w in alpha.workers] == ["w1@a"]


def test_a_mixed_release_shows_the_newest_workers_definition() -> None:
    newer = PublishedAgent("w9@new", "chain", "sha256:new", (), 50.0, 90.0)
    (chain,) = catalog.entries([row("w1@old", "chain", "sha256:old", 10.0, 100.0), newer])
    assert chain.mixed_release and chain.definitions == ("sha256:new", "sha256:old")
    assert (chain.definition_hash, chain.tools) == ("sha256:new", ())
    assert chain.to_dict()["mixed_release"] is True


def test_only_workers_seen_within_the_live_window_are_listed(sqlite_store: SQLStore) -> None:
    now = 10_000.0
    sqlite_store.publish_agents("gone@a", [row("gone@a", "old", "sha256:aa", 0, now - LIVE - 1)], 0)
    sqlite_store.publish_agents("live@b", [row("live@b", "chain", "sha256:aa", 0, now - LIVE)], 0)
    assert [e.name for e in catalog.live_agents(sqlite_store, now)] == ["chain"]


# -- creating a run --------------------------------------------------------------------


class NoStore:
    """A store that must not be asked: an agent registered here needs no round trip."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was asked: {name}")


def test_an_agent_registered_here_is_accepted_without_asking_the_store(
    registry: dict[str, Agent],
) -> None:
    register_agent(payer())
    catalog.require(NoStore(), "payer", 1000.0)  # type: ignore[arg-type]


def test_an_agent_a_live_worker_carries_is_accepted(
    registry: dict[str, Agent], sqlite_store: SQLStore
) -> None:
    rig = Rig(sqlite_store, clock=FakeClock(10_000.0))
    sqlite_store.publish_agents("w1@a", [row("w1@a", "remote", "sha256:aa", 0, 9_990.0)], 0)
    run_id = create_run(rig.runtime(), "remote", "far away", run_id="r1")
    run = rig.load(run_id)
    assert (run.agent, run.goal, run.status) == ("remote", "far away", RunStatus.PENDING)
    assert rig.sent == [("r1", 0)]


def test_an_agent_no_live_worker_carries_is_refused_with_the_known_agents(
    registry: dict[str, Agent], sqlite_store: SQLStore
) -> None:
    register_agent(payer())
    rig = Rig(sqlite_store, clock=FakeClock(10_000.0))
    published = [row("w1@a", "remote", "sha256:aa", 0, 9_990.0)]
    sqlite_store.publish_agents("w1@a", published, 0)
    sqlite_store.publish_agents("w2@b", [row("w2@b", "gone", "sha256:aa", 0, 100.0)], 0)
    for name in ("nobody", "gone"):
        with pytest.raises(AgentNotFound) as info:
            create_run(rig.runtime(), name, "g")
        assert info.value.name == name
        assert str(info.value) == (
            f"no agent named {name!r}; known agents (registered here or carried by a live "
            "worker): payer, remote"
        )
    assert rig.sent == [] and sqlite_store.query_runs(RunQuery(limit=10)) == []


def test_with_no_agent_anywhere_the_refusal_says_where_agents_come_from(
    registry: dict[str, Agent], sqlite_store: SQLStore
) -> None:
    with pytest.raises(AgentNotFound, match="none: no live worker carries one"):
        catalog.require(sqlite_store, "payer", 1000.0)


# -- what a worker publishes -----------------------------------------------------------


def test_a_worker_publishes_every_agent_it_registered(
    registry: dict[str, Agent], sqlite_store: SQLStore
) -> None:
    register_agent(payer())
    register_agent(payer(name="reader", tools=[look]))
    clock = FakeClock(500.0)
    publisher = Publisher(sqlite_store, "w1@a", clock)
    publisher.publish()
    clock.advance(30.0)
    publisher.publish()
    the_payer, reader = catalog.live_agents(sqlite_store, clock.now())
    assert the_payer.definition_hash == catalog.definition_hash(payer())
    assert the_payer.tools == (
        PublishedTool("pay", "at_most_once", True),
        PublishedTool("look", "read_only", False),
    )
    assert [(w.name, w.last_seen) for w in the_payer.workers] == [("w1@a", 530.0)]
    assert reader.tools == (PublishedTool("look", "read_only", False),)
    (stored,) = [r for r in sqlite_store.published_agents(0.0) if r.agent == "payer"]
    assert stored.started_at == 500.0  # when the worker first published


def test_a_worker_that_stops_withdraws_its_agents(
    registry: dict[str, Agent], sqlite_store: SQLStore
) -> None:
    register_agent(payer())
    clock = FakeClock(500.0)
    Publisher(sqlite_store, "w2@b", clock).publish()
    publisher = Publisher(sqlite_store, "w1@a", clock)
    publisher.publish()
    publisher.withdraw()
    (entry,) = catalog.live_agents(sqlite_store, clock.now())
    assert [w.name for w in entry.workers] == ["w2@b"]


def test_a_mixed_release_is_logged_once_naming_both_workers(
    registry: dict[str, Agent], sqlite_store: SQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(500.0)
    register_agent(payer())
    Publisher(sqlite_store, "old@a", clock).publish()
    register_agent(payer(max_steps=99))
    new = Publisher(sqlite_store, "new@b", clock)
    with caplog.at_level(logging.WARNING, logger="harness.catalog"):
        new.publish()
        clock.advance(30.0)
        new.publish()  # nothing changed: said once
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "mixed release" in warnings[0] and "payer" in warnings[0]
    assert "new@b" in warnings[0] and "old@a" in warnings[0]
    assert catalog.definition_hash(payer())[:19] in warnings[0]
    (entry,) = catalog.live_agents(sqlite_store, clock.now())
    assert entry.mixed_release


def test_an_agent_whose_name_no_run_can_hold_is_left_out_not_the_others(
    registry: dict[str, Agent], sqlite_store: SQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    register_agent(payer())
    register_agent(payer(name="x" * 201))
    with caplog.at_level(logging.WARNING, logger="harness.catalog"):
        Publisher(sqlite_store, "w1@a", FakeClock(500.0)).publish()
    assert [e.name for e in catalog.live_agents(sqlite_store, 500.0)] == ["payer"]
    assert "longer than 200 characters" in caplog.text
