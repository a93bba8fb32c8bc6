"""bench.toolloop's agent loop as a Prefect 3 flow of tasks, results persisted.

    make bench-prefect-venv          # .venv-prefect: prefect 3.9.1, nothing else of ours
    .venv-prefect/bin/python -m bench.prefect_loop --db URL --runs 1000 --sequential 20

Why a virtualenv of its own: prefect 3.9.1 (the newest) requires
``fastapi>=0.139,<0.151``, and the harness requires ``fastapi>=0.163`` (its HTTP
API, pinned 0.163.2 in constraints.txt); pip's resolver finds no version of
both. Everything else prefect asks for (SQLAlchemy 2.1, pydantic 2.14, ...)
resolves with our pins. So this module imports only prefect, the standard
library and bench.toolloop, and bench.agentloop runs it as a subprocess
that prints one JSON line.

What runs: one ``prefect server start`` subprocess (its API on loopback, its
database on our PostgreSQL through asyncpg, UI and analytics off), as Prefect
is deployed; the flows run in this process (and, for the 1,000 runs, in
``--procs`` processes of it), each flow run reporting its states and each
task's to that server over HTTP. Every task has ``persist_result=True``
with results on the local filesystem, and takes the run's id among its
inputs, so that its cache key (Prefect's default policy: inputs and source)
is that run's step and a retried flow would read the step's result back
rather than call the tool again, as a durable step should.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench import toolloop

WARMUP = 3


def _prefect_env(home: Path, api_url: str) -> dict[str, str]:
    """What the flow processes need: the server's URL, persisted results on disk."""
    return {
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api_url,
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
        "PREFECT_LOCAL_STORAGE_PATH": str(home / "results"),
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def start_server(home: Path, db_url: str, port: int) -> subprocess.Popen[bytes]:
    """``prefect server start`` on ``db_url``, ready to answer (its health check)."""
    env = dict(os.environ)
    env |= _prefect_env(home, f"http://127.0.0.1:{port}/api")
    env |= {
        "PREFECT_API_DATABASE_CONNECTION_URL": db_url,
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    }
    log = open(home / "server.log", "ab")  # noqa: SIM115 - the server's, kept open
    command = [sys.executable, "-m", "prefect", "server", "start"]
    server = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                return server
        except OSError:
            if server.poll() is not None:
                raise RuntimeError((home / "server.log").read_text()[-3000:]) from None
            time.sleep(0.5)
    server.kill()
    raise TimeoutError("prefect server not healthy after 120 s")


def make_flow() -> Any:
    """The flow: model task, tool task, ... until the model answers."""
    from prefect import flow, task

    @task(persist_result=True)
    def model_step(run: str, turn: int) -> str | None:
        return toolloop.next_call(turn)

    @task(persist_result=True)
    def tool_step(run: str, turn: int, name: str) -> int:
        return toolloop.call(name, turn)

    @flow(persist_result=True)
    def agent_loop(run: str) -> list[int]:
        results: list[int] = []
        turn = 0
        while (name := model_step(run, turn)) is not None:
            results.append(tool_step(run, turn, name))
            turn += 1
        return results

    return agent_loop


def one_run(flow: Any) -> float:
    """One run of the loop, checked; its wall seconds."""
    start = time.perf_counter()
    results = flow(str(uuid.uuid4()))
    elapsed = time.perf_counter() - start
    toolloop.expected(results)
    return elapsed


def _child(env: dict[str, str], index: int, runs: int, barrier: Any, out: Any) -> None:
    """A process of the 1,000 runs: warm up, wait for the others, run ``runs`` runs."""
    os.environ.update(env)
    flow = make_flow()
    toolloop.race(lambda: one_run(flow), WARMUP, runs, barrier, out)


def measure(db_url: str, sequential: int, runs: int, procs: int, port: int) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="bench-prefect-"))
    server = start_server(home, db_url, port)
    try:
        env = _prefect_env(home, f"http://127.0.0.1:{port}/api")
        os.environ.update(env)
        flow = make_flow()
        for _ in range(WARMUP):
            one_run(flow)
        per_run = [one_run(flow) for _ in range(sequential)]
        wall = toolloop.at_once(_child, (env,), runs, procs)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(home, ignore_errors=True)
    from importlib.metadata import version

    return {
        "version": version("prefect"),
        "ms_per_step": statistics.median(per_run) * 1000 / toolloop.STEPS_PER_RUN,
        "runs": runs,
        "procs": procs,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="postgresql+asyncpg:// URL, created already")
    parser.add_argument("--sequential", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--port", type=int, default=4283)
    args = parser.parse_args()
    print(json.dumps(measure(args.db, args.sequential, args.runs, args.procs, args.port)))


if __name__ == "__main__":
    main()
