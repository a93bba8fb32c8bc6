"""MCP servers as tools, against real servers in processes of their own: the
reference time server from PyPI (``mcp-server-time``, written by others), and
our own (tests.mcp_server) over stdio and streamable HTTP. Calls are counted
from the ledger the server writes; its process is killed from outside.

The runs here are carried in this process by the runner (tests.rig: no
Celery); tests/integration/test_mcp_workers.py carries them on real workers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import harness
from harness.engine import offering
from harness.engine.creation import create_run
from harness.errors import InvalidToolArgs, ToolError, ToolUnavailable
from harness.records import RunStatus, StepKind, StepStatus
from harness.store.memory import MemoryStore
from harness.tools import ToolContext, ToolEffect
from harness.toolsets import OfferedTool, ToolsetError, ToolsetUnavailable, sessions
from harness.toolsets.mcp import IDEMPOTENCY_META, MCPServer, MCPTool
from tests.ledger import Ledger
from tests.rig import Rig

REPO = Path(__file__).resolve().parents[2]


def our_server(ledger: Path, name: str = "ledger", **options: object) -> MCPServer:
    """tests.mcp_server over stdio, writing to ``ledger``."""
    env = {"PYTHONPATH": str(REPO), "MCP_LEDGER": str(ledger), "MCP_HOLD": str(ledger) + ".hold"}
    return MCPServer(
        name, command=sys.executable, args=["-m", "tests.mcp_server"], env=env, **options
    )  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _closed_sessions() -> Iterator[None]:
    """Each test starts its servers afresh, and leaves none running."""
    yield
    sessions.close_all()


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.txt"


def tool(server: MCPServer, name: str) -> MCPTool:
    (found,) = [t for t in server.bind(server.list_offered()) if t.name == name]
    assert isinstance(found, MCPTool)
    return found


def tool_of(server: MCPServer, name: str) -> MCPTool:
    """A tool as a run recorded it, bound without asking the server."""
    offered = OfferedTool(name, name, "", {"type": "object"}, ToolEffect.AT_MOST_ONCE)
    (bound,) = server.bind([offered])
    assert isinstance(bound, MCPTool)
    return bound


def call(spec: MCPTool, args: dict[str, object], run_id: str = "r", step: int = 1) -> object:
    return spec.invoke(spec.validate(args), ToolContext(run_id, step, 1))  # type: ignore[arg-type]


def wait_for(what: str, check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited
        return stat.read().split(")")[-1].split()[0] != "Z"


# -- listing -----------------------------------------------------------------------


def test_every_tool_is_offered_with_its_schema_description_and_effect(ledger: Path) -> None:
    server = our_server(ledger, prefix="desk", effects={"send": "idempotent"})
    offered = {t.name: t for t in server.list_offered()}
    assert set(offered) >= {"desk_weather", "desk_note", "desk_send", "desk_broken"}
    weather = offered["desk_weather"]
    assert weather.remote == "weather" and weather.effect is ToolEffect.READ_ONLY
    assert weather.description == "The weather in a city, now."
    assert weather.schema["properties"] == {"city": {"title": "City", "type": "string"}}
    assert weather.schema["required"] == ["city"]
    assert offered["desk_note"].effect is ToolEffect.IDEMPOTENT  # idempotentHint
    assert offered["desk_send"].effect is ToolEffect.IDEMPOTENT  # overridden
    assert offered["desk_broken"].effect is ToolEffect.AT_MOST_ONCE  # says nothing


def test_the_reference_time_server_from_pypi_is_offered_and_called() -> None:
    server = MCPServer("time", command=sys.executable, args=["-m", "mcp_server_time"])
    specs = {t.name: t for t in server.bind(server.list_offered())}
    assert {"get_current_time", "convert_time"} <= set(specs)
    now = specs["get_current_time"]
    assert now.effect is ToolEffect.READ_ONLY
    assert "timezone" in now.schema()["properties"]
    result = now.invoke(now.validate({"timezone": "Europe/Oslo"}), ToolContext("r", 1, 1))
    assert isinstance(result, dict) and result["timezone"] == "Europe/Oslo"
    with pytest.raises(ToolError, match="Invalid timezone"):
        now.invoke({"timezone": "Mars/Olympus"}, ToolContext("r", 2, 1))


def test_a_name_no_provider_takes_or_a_clash_is_an_error_when_the_list_is_read(
    ledger: Path,
) -> None:
    @harness.tool
    def note(text: str) -> str:
        return text

    server = our_server(ledger)
    agent = harness.Agent("clash", harness.ScriptedModel([]), tools=[note, server])
    listed = {server.name: server.list_offered()}
    with pytest.raises(ToolsetError, match="the name of a function tool: give the server a prefix"):
        offering.check_offered(agent, listed)
    bad = [OfferedTool("get.time", "get.time", "", {}, ToolEffect.READ_ONLY)]
    with pytest.raises(ToolsetError, match=r"server 'ledger' offers a tool name 'get.time'"):
        offering.check_offered(agent, {"ledger": bad})


def test_a_server_that_cannot_start_is_unavailable_with_its_own_message() -> None:
    server = MCPServer(
        "broken", command=sys.executable, args=["-c", "import sys; sys.exit('no API token set')"]
    )
    with pytest.raises(ToolsetUnavailable, match=r"could not be started.*no API token set"):
        server.list_offered()
    chatty = "import sys; sys.stderr.write('x' * 300000); sys.exit('bad config')"
    noisy = MCPServer("noisy", command=sys.executable, args=["-c", chatty])
    with pytest.raises(ToolsetUnavailable, match=r"it said: x+bad config$"):
        noisy.list_offered()  # its stderr read as it comes: a full pipe never blocks it
    missing = MCPServer("missing", command="/nonexistent/mcp-server")
    with pytest.raises(ToolUnavailable, match="could not be started") as caught:
        missing.call("anything", {}, "r:1")
    assert caught.value.sent is False


# -- calling -----------------------------------------------------------------------


def test_a_call_carries_the_key_and_keeps_structured_content_and_errors(ledger: Path) -> None:
    server = our_server(ledger)
    assert call(tool(server, "weather"), {"city": "Oslo"}) == {"city": "Oslo", "celsius": 21.5}
    assert call(tool(server, "note"), {"text": "hi"}, "run-7", 3) == {"result": "noted: hi"}
    assert list(Ledger.read(ledger).by_key) == ["run-7:3"]  # the key, from the call's _meta
    with pytest.raises(ToolError, match=r"tool 'broken': .*the printer is on fire"):
        call(tool(server, "broken"), {})
    with pytest.raises(InvalidToolArgs, match="tool 'note': arguments: 'text' is a required"):
        tool(server, "note").validate({"txt": "hi"})
    assert IDEMPOTENCY_META == "harness/idempotency_key"


def test_a_server_that_died_between_calls_is_started_again(ledger: Path) -> None:
    server = our_server(ledger)
    pid = tool(server, "pid")
    first = int(call(pid, {})["result"])  # type: ignore[index]
    assert server.connected()
    os.kill(first, signal.SIGKILL)
    # Its output ends: the session sees it close (a call sent before that
    # would meet the dead pipe, and be one that may have been made).
    wait_for("the session to see the server gone", lambda: not server.connected())
    second = int(call(pid, {})["result"])  # type: ignore[index]
    assert second != first and alive(second)
    sessions.close_all()
    wait_for("the server to stop with the session", lambda: not alive(second))


def test_a_server_killed_mid_call_leaves_the_call_sent_and_is_started_again(ledger: Path) -> None:
    server = our_server(ledger)
    held = tool(server, "held_send")
    first = int(call(tool(server, "pid"), {})["result"])  # type: ignore[index]
    Path(str(ledger) + ".hold").touch()
    failed: list[BaseException] = []

    def send() -> None:
        try:
            call(held, {"to": "bob"}, "r", 5)
        except BaseException as err:  # handed to the test's thread
            failed.append(err)

    caller = threading.Thread(target=send)
    caller.start()
    wait_for("the call to start", lambda: ledger.exists() and "r:5" in ledger.read_text())
    os.kill(first, signal.SIGKILL)
    caller.join(20)
    assert len(failed) == 1 and isinstance(failed[0], ToolUnavailable)
    assert failed[0].sent is True and "it may have been made" in str(failed[0])
    assert int(call(tool(server, "pid"), {})["result"]) != first  # type: ignore[index]


def test_streamable_http_with_headers(ledger: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = os.environ | {"PYTHONPATH": str(REPO), "MCP_LEDGER": str(ledger)}
    log = (tmp_path / "http.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_server", "--http", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        server = MCPServer(
            "http", url=f"http://127.0.0.1:{port}/mcp", headers={"Authorization": "Bearer t"}
        )

        def listed() -> bool:
            try:
                return bool(server.list_offered())
            except ToolsetUnavailable:
                return False

        wait_for("the HTTP server to answer", listed)
        assert call(tool(server, "note"), {"text": "over http"}, "h", 1) == {
            "result": "noted: over http"
        }
        assert list(Ledger.read(ledger).by_key) == ["h:1"]
        assert call(tool(server, "authorization"), {}) == {"result": "Bearer t"}
        proc.kill()
        proc.wait()
        # Down: the request found no server, so it was not sent (no doubt).
        with pytest.raises(ToolUnavailable, match="could not be reached") as caught:
            call(tool_of(server, "note"), {"text": "lost"}, "h", 2)
        assert caught.value.sent is False
    finally:
        proc.kill()
        proc.wait()
        log.close()


# -- runs ----------------------------------------------------------------------------


def test_a_run_is_offered_the_tools_recorded_when_it_started(ledger: Path) -> None:
    """The record is the run's: a second run of the same agent offered other
    tools (another prefix: as if the server changed) does not change the first."""
    rig = Rig(MemoryStore())
    server = our_server(ledger)
    turns = [
        {"tool_calls": [{"name": "note", "args": {"text": "one"}}]},
        {"tool_calls": [{"name": "weather", "args": {"city": "Oslo"}}]},
        {"final": "done"},
    ]
    harness.register_agent(
        harness.Agent("mcp-rig-desk", harness.ScriptedModel(turns), tools=[server])
    )
    run_id = create_run(rig.runtime(), "mcp-rig-desk", "note it", run_id="m1")
    rig.drive()
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED, run
    steps = rig.store.steps(run_id)
    assert [s.result for s in steps if s.kind is StepKind.TOOL] == [
        {"result": "noted: one"},
        {"city": "Oslo", "celsius": 21.5},
    ]
    assert list(Ledger.read(ledger).by_key) == ["m1:1"]
    record = rig.store.offered_tools(run_id)
    assert isinstance(record, dict)
    names = {t["name"]: t["effect"] for t in record["ledger"]}  # type: ignore[index, union-attr]
    assert names["note"] == "idempotent" and names["weather"] == "read_only"
    assert json.dumps(record).count('"schema"') == len(names)


def test_a_server_that_drops_a_tool_meanwhile_does_not_change_the_run(ledger: Path) -> None:
    """The run is still offered the tool it started with; the call of it, which
    the server no longer has, is an error result the model sees."""
    rig = Rig(MemoryStore())
    server = our_server(ledger)
    model = harness.ScriptedModel(
        [
            {"tool_calls": [{"name": "pid", "args": {}}]},
            {"tool_calls": [{"name": "note", "args": {"text": "late"}}]},
            {"final": "done"},
        ]
    )
    harness.register_agent(harness.Agent("mcp-drop", model, tools=[server]))
    create_run(rig.runtime(), "mcp-drop", "note it", run_id="d1")
    rig.drive(limit=2)  # the first turn, and its call of pid
    first = int(rig.store.steps("d1")[1].result["result"])  # type: ignore[index]
    Path(str(ledger) + ".drop").write_text("note\n")
    os.kill(first, signal.SIGKILL)  # it comes back without note
    wait_for("the session to see the server gone", lambda: not server.connected())
    rig.drive()
    assert rig.load("d1").status is RunStatus.COMPLETED
    call_step = rig.store.steps("d1")[3]
    assert call_step.status is StepStatus.FAILED
    assert "Unknown tool: note" in (call_step.error or ""), call_step.error
    assert "note" not in {t.name for t in server.list_offered()}  # the server's list now
    offered = rig.store.offered_tools("d1")
    assert "note" in {t["name"] for t in offered["ledger"]}  # type: ignore[index, union-attr]
    assert not ledger.exists()


def test_a_deploy_that_gates_a_tool_holds_for_a_run_already_in_flight(ledger: Path) -> None:
    """The run's record says `send` needs no approval; the agent deployed
    since says it does: the call waits for an operator, and is made once
    approved."""
    from harness.engine import operations

    rig = Rig(MemoryStore())
    turns = [
        {"tool_calls": [{"name": "weather", "args": {"city": "Oslo"}}]},
        {"tool_calls": [{"name": "send", "args": {"to": "everyone"}}]},
        {"final": "done"},
    ]
    agent = harness.Agent("mcp-gate", harness.ScriptedModel(turns), tools=[our_server(ledger)])
    harness.register_agent(agent)
    create_run(rig.runtime(), "mcp-gate", "go", run_id="a1")
    rig.drive(limit=2)  # the first turn and the weather call: the record is written
    gated = our_server(ledger, requires_approval=("send",))
    harness.register_agent(harness.Agent("mcp-gate", harness.ScriptedModel(turns), tools=[gated]))
    rig.drive()
    assert rig.load("a1").status is RunStatus.WAITING and not ledger.exists()
    assert rig.store.steps("a1")[3].status is StepStatus.AWAITING_APPROVAL
    operations.decide(rig.runtime(), "a1", approve=True, who="op", step_index=3)
    rig.drive()
    assert rig.load("a1").status is RunStatus.COMPLETED
    assert list(Ledger.read(ledger).by_key) == ["a1:3"]


def test_a_tool_gone_from_the_record_is_an_error_the_model_sees(ledger: Path) -> None:
    rig = Rig(MemoryStore())
    server = our_server(ledger)
    turns = [{"tool_calls": [{"name": "note", "args": {"text": "x"}}]}, {"final": "done"}]
    harness.register_agent(harness.Agent("mcp-gone", harness.ScriptedModel(turns), tools=[server]))
    # The run was offered only the weather when it started.
    (weather,) = [t for t in server.list_offered() if t.name == "weather"]
    rig.store.offer_tools("g1", offering.encode({"ledger": [weather]}), 0.0)
    create_run(rig.runtime(), "mcp-gone", "note it", run_id="g1")
    rig.drive()
    run = rig.load("g1")
    assert run.status is RunStatus.COMPLETED
    call_step = rig.store.steps("g1")[1]
    assert call_step.status is StepStatus.FAILED and "unknown tool 'note'" in (
        call_step.error or ""
    )
    assert not ledger.exists()


def test_a_call_without_an_answer_in_time_is_cancelled_and_may_have_been_made(
    ledger: Path,
) -> None:
    server = our_server(ledger, timeout=0.5)
    Path(str(ledger) + ".hold").touch()
    with pytest.raises(ToolUnavailable, match=r"no answer .* within 0.5s") as caught:
        call(tool(server, "held_note"), {"text": "slow"}, "t", 1)
    assert caught.value.sent is True
    Path(str(ledger) + ".hold").unlink()


def test_a_forked_child_starts_its_own_loop_and_server(ledger: Path) -> None:
    """As a prefork pool child: the parent's loop thread does not exist in the
    child, and its server is the parent's; the child starts its own."""
    server = our_server(ledger)
    parent_server = int(call(tool(server, "pid"), {})["result"])  # type: ignore[index]
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report its server's pid, or the error
        try:
            answer = str(call(tool(server, "pid"), {})["result"])  # type: ignore[index]
            sessions.close_all()
        except BaseException as err:
            answer = f"error: {err!r}"
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(child, 0)
    assert answer.isdigit() and int(answer) != parent_server, answer
    assert int(call(tool(server, "pid"), {})["result"]) == parent_server  # type: ignore[index]
