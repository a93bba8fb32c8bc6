"""Blobs in a directory, written by real `celery -A tasks worker` processes.

The workers and the CLI are configured by the environment alone
(HARNESS_BLOB_THRESHOLD, HARNESS_BLOB_DIR): results above the threshold
leave their rows for files in the run's folder, and every reader still sees
them whole, a fork made by the CLI and carried by a worker included.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from harness.cli import main
from harness.records import RunStatus
from harness.store import schema
from harness.store.blobs import run_folder
from harness.store.sql import make_engine
from tests.cluster import Cluster

pytestmark = pytest.mark.slow

THRESHOLD = 32


def cli(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def stored(database_url: str, run_id: str) -> list[tuple[str | None, str | None]]:
    """(result, result_blob) of the run's steps, as the table holds them."""
    engine = make_engine(database_url)
    query = select(schema.steps.c.result, schema.steps.c.result_blob).where(
        schema.steps.c.run_id == run_id
    )
    try:
        with engine.connect() as conn:
            return [(r, b) for r, b in conn.execute(query).all()]
    finally:
        engine.dispose()


def test_workers_keep_large_results_as_files_and_readers_see_them_whole(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    blobs = tmp_path / "shared-blobs"
    c = make_cluster(
        "filesystem", HARNESS_BLOB_THRESHOLD=str(THRESHOLD), HARNESS_BLOB_DIR=str(blobs)
    )
    c.worker()
    (run_id,) = c.start("chain")
    c.assert_completed_once([run_id])

    shown = cli("show", run_id, "--json")
    tool_results = [s["result"] for s in shown["steps"] if s["kind"] == "tool"]
    assert tool_results == [{"n": i, "key": f"{run_id}:{2 * i + 1}"} for i in range(3)]
    rows = stored(c.env["HARNESS_DATABASE_URL"], run_id)
    assert all(result is None or len(result) <= THRESHOLD for result, _ in rows)
    digests = {blob for _, blob in rows if blob is not None}
    assert len(digests) >= 3  # the tool steps' results at least
    files = {f"sha256:{p.stem}" for p in (blobs / run_folder(run_id)).iterdir()}
    assert digests <= files

    fork_id = cli("fork", run_id, "--at", "4", "--json")["run_id"]
    (fork,) = c.wait_all([fork_id])
    assert fork.status is RunStatus.COMPLETED
    forked = cli("show", fork_id, "--json")
    copied = [s["result"] for s in forked["steps"][:4]]
    assert copied == [s["result"] for s in shown["steps"][:4]]
    assert (blobs / run_folder(fork_id)).is_dir()  # the copies are the fork's own files
