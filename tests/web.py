"""A dashboard stack for browser tests: a real ``harness serve`` process, a
real worker on the same store, and Debian's Chromium driven by Playwright.

Browser downloads are impossible here, so Playwright launches the system
``chromium`` (``.ci/run`` installs it). Without it the tests skip, or fail
under HARNESS_REQUIRE_SERVICES=1, as a missing service does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.celery.process import WorkerProcess
from harness.engine import transitions
from harness.records import Run, RunStatus, Step, StepKind, StepStatus
from harness.store.migrate import upgrade
from harness.store.sql import SQLStore, make_engine

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("HARNESS_TEST_CHROMIUM", "/usr/bin/chromium")
# The machine's network is closed: without these Chromium floods refused connections.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# `harness`, the console script installed beside this interpreter.
HARNESS_CLI = str(Path(sys.executable).with_name("harness"))
TOKEN = "dashboard-test-token"
VIEWPORT = {"width": 1280, "height": 800}


def require_chromium() -> None:
    """Skip (or fail, under HARNESS_REQUIRE_SERVICES=1) without Chromium and Playwright."""
    reason = None
    if not os.access(CHROMIUM, os.X_OK):
        reason = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright package is not installed"
    if reason is None:
        return
    if os.environ.get("HARNESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}, and HARNESS_REQUIRE_SERVICES=1")
    pytest.skip(reason)


def artifacts_dir() -> Path:
    """Where screenshots go: $HARNESS_TEST_ARTIFACTS, else test-artifacts/ in the repository."""
    root = Path(os.environ.get("HARNESS_TEST_ARTIFACTS", REPO / "test-artifacts"))
    path = root / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Poll ``check`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout}s")
        time.sleep(0.05)


@dataclass
class Stack:
    """The server's address, an HTTP client holding the token, and the store."""

    base_url: str
    env: dict[str, str]
    home: Path
    client: httpx.Client
    store: SQLStore
    server_log: Path

    def start(self, agent: str, goal: str) -> str:
        response = self.client.post("/api/runs", json={"agent": agent, "goal": goal})
        assert response.status_code == 201, response.text
        return str(response.json()["run_id"])

    def run(self, run_id: str) -> dict[str, Any]:
        response = self.client.get(f"/api/runs/{run_id}", params={"steps": "false"})
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_status(self, run_id: str, *statuses: str, timeout: float = 30.0) -> dict[str, Any]:
        return dict(
            wait_for(
                f"run {run_id} to be {'/'.join(statuses)}",
                lambda: (run := self.run(run_id))["status"] in statuses and run,
                timeout,
            )
        )

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.home.glob("*.log"))
        )


@contextmanager
def _server(env: dict[str, str], home: Path, port: int) -> Iterator[Path]:
    log_path = home / "serve.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [HARNESS_CLI, "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield log_path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextmanager
def dashboard_stack(home: Path, **overrides: str) -> Iterator[Stack]:
    """SQLite and the ``filesystem://`` broker (the embedded default), one
    worker, and ``harness serve`` on a free port, all sharing one store."""
    home.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{home / 'harness.db'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    settings = {
        "HARNESS_DATABASE_URL": url,
        "HARNESS_BROKER_URL": "filesystem://",
        "HARNESS_HOME": str(home / ".harness"),
        "HARNESS_IMPORTS": "tests.agents",
        "HARNESS_LEASE_TTL": "2",
        "HARNESS_TEST_LEDGER": str(home / "ledger.txt"),
        "HARNESS_API_TOKEN": TOKEN,
        **overrides,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env |= {k: v for k, v in os.environ.items() if k.startswith("HARNESS_TEST_")}
    env |= settings | {"PYTHONPATH": str(REPO)}
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        worker = WorkerProcess("w1", env, home, cwd=home)
        stack.callback(worker.kill)
        server_log = stack.enter_context(_server(env, home, port))
        client = stack.enter_context(
            httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {TOKEN}"})
        )
        store = SQLStore.from_url(url)
        stack.callback(store.close)
        result = Stack(base_url, env, home, client, store, server_log)

        def healthy() -> bool:
            try:
                return client.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_for("harness serve to answer", healthy, timeout=30)
            worker.wait_ready()
        except (TimeoutError, RuntimeError) as err:
            raise RuntimeError(f"{err}\n{result.logs()}") from err
        yield result


def seed_run(
    store: SQLStore,
    run_id: str,
    steps: list[Step],
    *,
    status: RunStatus = RunStatus.COMPLETED,
    goal: str = "a seeded run",
    agent: str = "seeded",
    **fields: Any,
) -> None:
    """A run written straight into the store, no worker involved: for pages
    that only read (a huge run) or states a worker would take long to reach.
    Its wake-up is a day away, so a worker or sweeper leaves it alone."""
    now = time.time()
    cursor = fields.pop("cursor", len(steps) - 1)
    run = Run(
        run_id,
        agent,
        goal,
        status,
        cursor=cursor,
        version=1,
        step_count=len(steps),
        created_at=fields.pop("created_at", now),
        updated_at=now,
        **fields,
    )
    _, inserted = store.create_run(run, steps, now + 86_400, transitions.created(run))
    assert inserted, run_id


def chain_steps(run_id: str, count: int, started: float | None = None) -> list[Step]:
    """``count`` finished steps, model and tool in turn, a few milliseconds each."""
    t = time.time() - 3600 if started is None else started
    steps = []
    for i in range(count):
        if i % 2 == 0:
            step = Step(
                run_id,
                i,
                StepKind.MODEL,
                StepStatus.DONE,
                attempts=1,
                args={"turn": i // 2},
                result={
                    "tool_calls": [{"name": "effect", "args": {"n": i // 2}}],
                    "usage": {"input_tokens": 120 + i, "output_tokens": 30},
                    "cost_usd": 0.0004,
                },
                started_at=t,
                finished_at=t + 0.35,
            )
        else:
            step = Step(
                run_id,
                i,
                StepKind.TOOL,
                StepStatus.DONE,
                attempts=1,
                tool="effect",
                args={"n": i // 2},
                result={"n": i // 2, "key": f"{run_id}:{i}"},
                started_at=t,
                finished_at=t + 0.02,
            )
        steps.append(step)
        t += 0.4
    return steps
