"""The harness installed into an application of its own (examples/own_celery_app):
another queue name, its own tasks and beat schedule, run as the README says
(under root too, as here: no pickle). Real ``celery -A shop worker|beat``
processes, Redis, PostgreSQL. (An app whose own serializer is pickle:
tests/unit/test_celery_layer.py.)"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from harness import api
from harness.celery.process import WorkerProcess
from harness.records import RunStatus
from tests.services import REDIS_APP_DBS, REDIS_URL, require

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own_celery_app"
HARNESS = Path(sys.executable).with_name("harness")


class Shop:
    """The shop's environment, its broker, and its processes."""

    def __init__(self, env: dict[str, str], broker: redis.Redis, logs: Path) -> None:
        self.env = env
        self.broker = broker
        self.logs = logs
        self.processes: list[WorkerProcess] = []

    def _run(self, argv: list[str], env: dict[str, str]) -> str:
        done = subprocess.run(
            argv, cwd=EXAMPLE, env=self.env | env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def python(self, code: str, **env: str) -> str:
        """Run ``code`` in a process of the shop's own (it imports the shop's app)."""
        return self._run([sys.executable, "-c", code], env)

    def harness_start(self, **env: str) -> str:
        """``harness start`` from the command line: a process without the shop's app."""
        out = self._run([str(HARNESS), "start", "shop-assistant", "how many mugs?", "--json"], env)
        return str(json.loads(out)["run_id"])

    def queued(self, queue: str) -> list[dict[str, object]]:
        return [json.loads(raw) for raw in self.broker.lrange(queue, 0, -1)]

    def start(self, name: str, *extra: str, beat: bool = False) -> WorkerProcess:
        proc = WorkerProcess(name, self.env, self.logs, extra, EXAMPLE, beat=beat, app="shop")
        self.processes.append(proc)
        return proc.wait_ready()


@pytest.fixture
def shop(postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    require("redis")
    broker_url, backend_url = (f"{REDIS_URL}/{db}" for db in REDIS_APP_DBS)
    for url in (broker_url, backend_url):
        redis.Redis.from_url(url).flushdb()
    harness_env = {
        "HARNESS_DATABASE_URL": postgres_url,
        "HARNESS_BROKER_URL": broker_url,
        "HARNESS_QUEUE": "agents",
        "HARNESS_IMPORTS": "shop.agents",
        "HARNESS_HOME": str(tmp_path / ".harness"),
        "HARNESS_LEASE_TTL": "2",
        "HARNESS_SWEEP_INTERVAL": "0.5",
    }
    for name, value in harness_env.items():
        monkeypatch.setenv(name, value)
    api.reset_runtime()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")} | harness_env
    env |= {
        # The shop's own settings (shop/config.py), not the harness's.
        "SHOP_BROKER_URL": broker_url,
        "SHOP_RESULT_BACKEND": backend_url,
        "SHOP_RESTOCK_EVERY": "0.5",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    client = redis.Redis.from_url(broker_url)
    s = Shop(env, client, tmp_path / "logs")
    try:
        yield s
    finally:
        for proc in s.processes:
            proc.kill()
        client.close()


def _wait(what: str, check: object, logs: list[WorkerProcess], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.log_path.name}\n{p.log()[-3000:]}" for p in logs)
            raise TimeoutError(f"gave up waiting for {what}\n{tails}")
        time.sleep(0.05)


def _completed(run_id: str) -> bool:
    return api.get_run(run_id).status is RunStatus.COMPLETED


@pytest.mark.redis
def test_the_harness_runs_inside_an_app_of_its_own(shop: Shop) -> None:
    # From the shop's own code: a run, sent through the shop's app, and a task of
    # the shop's own.
    sent = shop.python(
        "import json, harness\n"
        "from shop.tasks import pack\n"
        "run_id = harness.start_run('shop-assistant', 'how many mugs?')\n"
        "pack.delay('mug', 2)\n"
        "print(json.dumps(run_id))\n"
    )
    from_app = json.loads(sent)
    (step,) = shop.queued("agents")
    assert step["content-type"] == "application/json"
    headers = step["headers"]
    assert isinstance(headers, dict)
    assert headers["task"] == "tasks.run_step"
    # Flower's task list shows the run and the cursor; the message carries nothing else.
    assert (headers["argsrepr"], headers["kwargsrepr"]) == (f"run={from_app}", "cursor=0")
    args, kwargs, _ = json.loads(base64.b64decode(str(step["body"])))
    assert (args, kwargs) == ([from_app], {"cursor": 0})
    (parcel,) = shop.queued("shop")
    assert parcel["headers"]["task"] == "shop.tasks.pack"  # type: ignore[index]

    # From the command line (no shop app): HARNESS_QUEUE names the shop's queue...
    from_cli = shop.harness_start()
    assert len(shop.queued("agents")) == 2
    # ...and without it the message goes to the default queue, where nobody listens.
    stray = shop.harness_start(HARNESS_QUEUE="")
    assert len(shop.queued("harness")) == 1

    worker = shop.start("shop", "-Q", "shop,agents", "--concurrency=2")
    banner = worker.log()
    for queue in ("shop", "agents", "agents.recovery"):  # the lane comes with its queue
        assert f".> {queue} " in banner, banner
    _wait("both runs", lambda: _completed(from_app) and _completed(from_cli), [worker])
    _wait("the shop's own task", lambda: "'packed 2 x mug'" in worker.log(), [worker])
    for run_id in (from_app, from_cli):  # every step message went where the worker listens
        kinds = [e.to_status for e in api.runtime().store.events(run_id)]
        assert "redispatched" not in kinds, kinds

    # No beat yet: the worker takes the sweep over, which rescues the stray run
    # through the shop's app onto the recovery lane.
    _wait("the stray run", lambda: _completed(stray), [worker])
    assert "(is `celery beat` running?): this worker sweeps until one is" in worker.log()
    assert f"sweeper re-dispatched run={stray}" in worker.log()

    # Beat: the shop's schedule, and the sweep, which the worker hands back.
    beat = shop.start("shop-beat", beat=True)
    procs = [worker, beat]
    _wait("the worker to hand the sweep back", lambda: "stops sweeping" in worker.log(), procs)
    _wait("the shop's restock", lambda: "shop.tasks.restock" in worker.log(), procs)
    assert len(shop.queued("harness")) == 1  # never consumed: the sweep did it
    assert not shop.broker.exists("celery")  # nothing fell into Celery's default queue
