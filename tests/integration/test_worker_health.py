"""Worker liveness with a real `celery -A tasks worker`: the heartbeat file is
refreshed while the worker consumes, goes stale when it stops (SIGSTOP: as
wedged as a process can be), and is removed at a warm shutdown."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from harness.celery import health
from harness.settings import Settings
from tests.cluster import Cluster

pytestmark = pytest.mark.slow

MAX_AGE = 4.0  # the filesystem broker's loop turns every 2 s when idle


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_heartbeat_is_fresh_while_consuming_and_stale_once_stopped(
    make_cluster: Callable[..., Cluster], broker: str
) -> None:
    c = make_cluster(broker)
    path = Settings.from_env().worker_heartbeat_file
    worker = c.worker(*(("--concurrency=2",) if broker != "filesystem" else ()))

    def healthy() -> bool:
        return health.check(path, MAX_AGE).healthy

    c.wait_until("a fresh heartbeat", healthy, timeout=10)
    assert (health.check(path).worker or "").startswith(f"{worker.name}@")
    first = path.stat().st_mtime
    c.wait_until("the heartbeat refreshed", lambda: path.stat().st_mtime > first, timeout=5)

    worker.proc.send_signal(signal.SIGSTOP)
    try:
        stopped = path.stat().st_mtime
        c.wait_until("a stale heartbeat", lambda: not healthy(), timeout=MAX_AGE + 4)
        assert path.stat().st_mtime == stopped, "refreshed by a stopped worker"
    finally:
        worker.proc.send_signal(signal.SIGCONT)
    c.wait_until("a fresh heartbeat again", healthy, timeout=10)

    worker.stop()
    if path.exists():  # say how it stopped: killed after the warm shutdown's timeout, or not
        tail = worker.log_path.read_text(errors="replace")[-2000:]
        pytest.fail(
            f"a stopped worker left its heartbeat behind: exit {worker.proc.returncode}\n{tail}"
        )
    assert health.check(path).age is None
