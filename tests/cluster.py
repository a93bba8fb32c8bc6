"""Real worker clusters for integration and chaos tests.

A :class:`Cluster` is one configuration (broker + database + cache) with
``celery worker`` and ``celery beat`` subprocesses, an external ledger for
side effects, and the in-process API pointed at the same configuration.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import redis
from kombu import Connection, pools

from harness import api
from harness.celery.config import QUEUE, RECOVERY_QUEUE
from harness.celery.process import WorkerProcess
from harness.records import Run, RunStatus, WaitKind
from tests.ledger import Ledger
from tests.services import RABBITMQ_URL, REDIS_BROKER_DB, REDIS_URL, require

REPO = Path(__file__).resolve().parents[1]
LEASE_TTL = 2.0
IMPORTS = "tests.agents"
#: Added when the ``wire`` fixture has pointed the SDKs at its server: the provider agents,
#: whose SDKs would add a second to every other worker's start.
PROVIDER_IMPORTS = ",tests.provider_agents"
SWEEP_INTERVAL = 0.5


class Cluster:
    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env = env
        self.home = home
        self.ledger_path = Path(env["HARNESS_TEST_LEDGER"])
        self.processes: list[WorkerProcess] = []
        self.killed: dict[int, list[float]] = {}  # pid -> when we killed it (or saw it dead)
        self._count = 0

    def worker(self, *extra: str, env: dict[str, str] | None = None) -> WorkerProcess:
        self._count += 1
        proc = WorkerProcess(
            f"w{self._count}", self.env | (env or {}), self.home, extra=extra, cwd=self.home
        )
        self.processes.append(proc)
        return proc.wait_ready()

    def beat(self) -> WorkerProcess:
        proc = WorkerProcess("sweeper", self.env, self.home, cwd=self.home, beat=True)
        self.processes.append(proc)
        return proc.wait_ready()

    def kill(self, proc: WorkerProcess) -> None:
        """SIGKILL a whole worker (or note one that killed itself)."""
        for pid, at in proc.kill().items():
            self.killed.setdefault(pid, []).append(at)

    def kill_pid(self, pid: int) -> None:
        """SIGKILL one process, a pool child say."""
        os.kill(pid, signal.SIGKILL)
        self.killed.setdefault(pid, []).append(time.time())

    def start(self, agent: str, count: int = 1) -> list[str]:
        return [api.start_run(agent, f"goal {i}") for i in range(count)]

    def wait_all(self, run_ids: list[str], timeout: float = 60) -> list[Run]:
        deadline = time.monotonic() + timeout
        runs = [api.wait_for(r, max(0.1, deadline - time.monotonic())) for r in run_ids]
        unfinished = [r for r in runs if not (r.status.terminal or r.status.held)]
        assert not unfinished, f"runs still moving after {timeout}s: {unfinished}\n{self.logs()}"
        return runs

    def wait_ended(self, run_ids: list[str], timeout: float = 60) -> list[Run]:
        """Wait until every run has ended. :meth:`wait_all` stops at a run held
        for an operator; a run waiting on the world (a deferred call, a sleep,
        a child run) moves on by itself, so this waits through its waits."""
        self.wait_until(
            "the runs to end",
            lambda: all(api.get_run(r).status.terminal for r in run_ids),
            timeout,
        )
        return [api.get_run(r) for r in run_ids]

    def wait_until(self, what: str, check: object, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not check():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what}\n{self.logs()}")
            time.sleep(0.02)

    def ledger(self) -> Ledger:
        return Ledger.read(self.ledger_path)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()[-2500:]}" for p in self.processes)

    def assert_completed_once(
        self, run_ids: list[str], unledgered: frozenset[str] = frozenset()
    ) -> Ledger:
        """Every run completed, and every child run they started; every tool step
        is done and had its effect (a delegation's effects are its child's; the
        tools named in ``unledgered`` write none); no effect for a step that does
        not exist; a step was called again only after the process running its
        previous call was killed; no two calls at once."""
        run_ids = with_children(run_ids)
        for run in self.wait_all(run_ids):
            assert run.status is RunStatus.COMPLETED, f"{run}\n{self.logs()}"
        ledger = self.ledger()
        tool_keys = set()
        for run_id in run_ids:
            for step in api.get_steps(run_id):
                if step.kind != "tool":
                    continue
                tool_keys.add(step.idempotency_key)
                assert step.status == "done", step
                if step.wait is not None and step.wait.kind is WaitKind.CHILD:
                    continue
                if step.tool in unledgered:
                    continue
                assert ledger.effects(step.idempotency_key) >= 1, f"{step} skipped"
        assert set(ledger.by_key) <= tool_keys, "effects for steps that do not exist"
        assert ledger.unjustified_repeats(self.killed) == [], "called again without a kill"
        assert ledger.overlapping(self.killed) == [], "two calls of one step at once"
        return ledger

    def close(self) -> None:
        for proc in self.processes:
            proc.kill()


def with_children(run_ids: list[str]) -> list[str]:
    """``run_ids`` and the child runs they started, theirs, and so on."""
    store = api.runtime().store
    found, todo = list(run_ids), list(run_ids)
    while todo:
        children = [c.run_id for c in store.children(todo.pop())]
        found += children
        todo += children
    return found


def _purge(broker: str, url: str) -> None:
    if broker == "redis":
        redis.Redis.from_url(url).flushdb()
    elif broker == "rabbitmq":
        with Connection(url) as conn:
            channel = conn.default_channel
            for queue in (QUEUE, RECOVERY_QUEUE):
                with suppress(Exception):
                    channel.queue_delete(queue)
        # This process's pooled connections remember the queues as declared, and
        # would publish to an exchange with nothing bound: forget them.
        pools.reset()


@contextmanager
def cluster(
    broker: str,
    tmp_path: Path,
    database_url: str,
    redis_cache: str | None,
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, str],
) -> Iterator[Cluster]:
    broker_url = {
        "filesystem": "filesystem://",
        "redis": f"{REDIS_URL}/{REDIS_BROKER_DB}",
        "rabbitmq": RABBITMQ_URL,
    }[broker]
    if broker != "filesystem":
        require(broker)
        _purge(broker, broker_url)
    home = tmp_path / "cluster"
    home.mkdir()
    settings = {
        "HARNESS_DATABASE_URL": database_url,
        "HARNESS_BROKER_URL": broker_url,
        "HARNESS_HOME": str(home / ".harness"),
        "HARNESS_IMPORTS": IMPORTS + (PROVIDER_IMPORTS if "OPENAI_BASE_URL" in os.environ else ""),
        "HARNESS_LEASE_TTL": str(LEASE_TTL),
        "HARNESS_SWEEP_INTERVAL": str(SWEEP_INTERVAL),
        "HARNESS_TEST_LEDGER": str(home / "ledger.txt"),
    }
    settings |= overrides
    if redis_cache:
        settings["HARNESS_REDIS_URL"] = redis_cache
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")} | settings
    env["PYTHONPATH"] = str(REPO)
    api.reset_runtime()
    c = Cluster(env, home)
    try:
        yield c
    finally:
        c.close()
