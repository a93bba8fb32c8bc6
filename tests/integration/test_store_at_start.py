"""A worker or beat without a usable run store refuses to start (issue 21).

A wrong ``HARNESS_DATABASE_URL`` or an unmigrated PostgreSQL database used to
give a worker that started, logged nothing at the default level and failed
every step; ``harness health`` said healthy. Now the main process opens the
store as it starts and, if it cannot, exits 1 with one line naming the store
(its password masked), and ``harness health`` exits 1 with the same reason.
Real ``celery -A tasks worker|beat`` and ``harness`` processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from harness.store.migrate import head_revision
from tests.services import POSTGRES_ADMIN_URL, POSTGRES_TEST_DB, require

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
#: A password that must never be printed.
SECRET = "s3cret-pw"
UNREACHABLE = f"postgresql://nobody:{SECRET}@127.0.0.1:1/x"


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    return base | {"HARNESS_DATABASE_URL": url, "HARNESS_HOME": str(tmp_path / ".harness")}


def _run(tmp_path: Path, url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end (a worker that did not refuse would time out)."""
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=tmp_path,
        env=_env(tmp_path, url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _refused(done: subprocess.CompletedProcess[str], process: str, *fragments: str) -> str:
    """The one line a refused worker or beat printed: last on stderr (after
    Celery's own warnings), no traceback, no password anywhere."""
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    assert SECRET not in done.stdout + done.stderr
    line = done.stderr.rstrip("\n").splitlines()[-1]
    assert f"harness: this {process} cannot start: " in line, done.stderr
    for fragment in fragments:
        assert fragment in line
    return line


def test_a_worker_with_an_unreachable_store_refuses_to_start(tmp_path: Path) -> None:
    done = _run(tmp_path, UNREACHABLE, "celery", "-A", "tasks", "worker")
    line = _refused(done, "worker", "cannot reach the run store", "nobody:***@127.0.0.1:1/x")
    assert line.startswith("harness: this worker cannot start: ")
    assert " ready." not in done.stdout + done.stderr  # it never consumed

    health = _run(tmp_path, UNREACHABLE, "harness", "health")
    assert health.returncode == 1
    assert health.stdout.startswith("unhealthy: cannot reach the run store ")
    assert SECRET not in health.stdout + health.stderr
    worker = _run(tmp_path, UNREACHABLE, "harness", "health", "--worker")
    assert worker.returncode == 1
    assert worker.stdout.startswith("unhealthy: no worker heartbeat")


def test_beat_with_an_unreachable_store_refuses_to_start(tmp_path: Path) -> None:
    done = _run(tmp_path, UNREACHABLE, "celery", "-A", "tasks", "beat", "-s", "sched")
    # Beat logs its stderr: the line ends its output, whichever stream carries it.
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert "harness: this beat cannot start: cannot reach the run store" in done.stderr


def test_a_postgres_url_says_use_postgresql(tmp_path: Path) -> None:
    url = f"postgres://nobody:{SECRET}@127.0.0.1:1/x"
    done = _run(tmp_path, url, "celery", "-A", "tasks", "worker")
    _refused(done, "worker", "'postgres://nobody:***@127.0.0.1:1/x'", "use postgresql://")

    health = _run(tmp_path, url, "harness", "health")
    assert health.returncode == 1
    assert "use postgresql://" in health.stdout
    listed = _run(tmp_path, url, "harness", "list")
    assert listed.returncode == 1
    assert listed.stderr == (
        "error: unusable database URL 'postgres://nobody:***@127.0.0.1:1/x': "
        "use postgresql:// (SQLAlchemy does not know postgres://)\n"
    )


@pytest.fixture
def unmigrated_url() -> str:
    """An empty PostgreSQL database of this suite's own (made afresh)."""
    require("postgres")
    name = f"{POSTGRES_TEST_DB}_unmigrated"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


@pytest.mark.postgres
def test_a_worker_on_an_unmigrated_database_refuses_to_start(
    tmp_path: Path, unmigrated_url: str
) -> None:
    done = _run(tmp_path, unmigrated_url, "celery", "-A", "tasks", "worker")
    _refused(done, "worker", "is at revision none", "run `harness migrate`")

    health = _run(tmp_path, unmigrated_url, "harness", "health")
    assert health.returncode == 1
    assert "is at revision none" in health.stdout

    assert _run(tmp_path, unmigrated_url, "harness", "migrate").returncode == 0
    health = _run(tmp_path, unmigrated_url, "harness", "health", "--json")
    assert health.returncode == 0, health.stdout
    assert f'"revision": "{head_revision()}"' in health.stdout
