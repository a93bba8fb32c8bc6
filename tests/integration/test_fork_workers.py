"""Forks carried by a real `celery -A tasks worker` (the embedded default broker).

The ledger counts every real call of the ``effect`` tool by idempotency key:
a fork at a model turn runs only the calls from that turn on, under its own
keys, and the original run is only read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.records import RunStatus
from tests.cluster import Cluster

pytestmark = pytest.mark.slow


def cli(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_fork_never_re_executes_a_step_before_its_fork_point(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster("filesystem")
    c.worker()
    c.beat()
    (run_id,) = c.start("chain")
    c.assert_completed_once([run_id])
    before = cli("show", run_id, "--json")

    started = time.perf_counter()
    fork_id = cli("fork", run_id, "--at", "2", "--json")["run_id"]
    forked_in = time.perf_counter() - started
    (fork,) = c.wait_all([fork_id])
    done_in = time.perf_counter() - started
    print(
        f"fork of a 7-step run created in {forked_in * 1000:.1f} ms, completed in {done_in:.2f} s"
    )

    assert fork.status is RunStatus.COMPLETED and fork.result == "3 effects done"
    ledger = c.ledger()
    # The call before the fork point never ran again; the two after it ran once each.
    assert ledger.calls(f"{fork_id}:1") == 0
    assert ledger.calls(f"{fork_id}:3") == ledger.calls(f"{fork_id}:5") == 1
    original_keys = {f"{run_id}:{i}" for i in (1, 3, 5)}
    assert set(ledger.by_key) == original_keys | {f"{fork_id}:3", f"{fork_id}:5"}
    assert all(ledger.calls(key) == 1 for key in original_keys)

    shown = cli("show", fork_id, "--json")
    assert shown["forked_from"] == {"run_id": run_id, "step": 2}
    # The copied call's result still names the original's key: it was never re-made.
    assert shown["steps"][1]["result"] == {"n": 0, "key": f"{run_id}:1"}
    assert shown["steps"][3]["result"] == {"n": 1, "key": f"{fork_id}:3"}
    assert cli("show", run_id, "--json") == before  # the original: same steps, same version
    listed = cli("list", "--forked-from", run_id, "--json")
    assert [r["run_id"] for r in listed] == [fork_id]
    assert cli("list", "--forked-from", fork_id, "--json") == []

    refused = CliRunner().invoke(main, ["fork", run_id, "--at", "3", "--json"])
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr == (
        "error: step 3 is a tool step: a fork starts at a model turn: 0, 2, 4, 6\n"
    )
