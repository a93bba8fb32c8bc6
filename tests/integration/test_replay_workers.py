"""Replays carried by real `celery -A tasks worker` processes (PostgreSQL, Redis).

Twenty desk runs are recorded (tests.agents: a lookup, a refund, a mail per
run), then replayed under the desk's second version, which follows ten of
them and leaves the other ten: five at the refund (an idempotent call), five
at the lookup (a read_only one). The ledger counts every real call of every
tool from outside the workers: the replays make none, and with
--live-read-only only the read_only lookups that left the recording.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner, Result

from harness import api
from harness.cli import EXIT_DIVERGED, main
from harness.records import RunStatus
from tests.cluster import Cluster

pytestmark = pytest.mark.slow

#: US dollars per million tokens: version 2 is the cheaper model.
PRICES = {"desk-1": {"input": 2.0, "output": 8.0}, "desk-2": {"input": 1.0, "output": 4.0}}
RUNS = 20


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def replay_keys(c: Cluster, replay_ids: set[str]) -> list[str]:
    return sorted(k for k in c.ledger().by_key if k.split(":")[0] in replay_ids)


@pytest.mark.postgres
@pytest.mark.redis
def test_replays_of_twenty_recorded_runs_never_call_a_side_effecting_tool(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster("redis", HARNESS_PRICES=json.dumps(PRICES))
    c.worker()
    c.beat()
    recorded = [api.start_run("desk", f"order {n}", run_id=f"order-{n}") for n in range(RUNS)]
    runs = c.wait_all(recorded)
    assert {r.status for r in runs} == {RunStatus.COMPLETED}
    before = c.ledger()
    assert len(before.by_key) == 3 * RUNS and all(before.calls(k) == 1 for k in before.by_key)

    batch = invoke(
        "replay", "--batch", "--agent", "desk-v2", "--from-agent", "desk", "--limit", "50", "--json"
    )
    assert batch.exit_code == 0, batch.output
    summary: dict[str, Any] = json.loads(batch.stdout)
    assert (summary["runs"], summary["matched"], summary["diverged"]) == (RUNS, 10, 10)
    assert summary["diverged_at"] == [
        {"step": 1, "at": "find", "count": 5},
        {"step": 3, "at": "effect", "count": 5},
    ]
    replays = {r["replay"]["run_id"] for r in summary["replays"]}
    assert {r["recording"]["run_id"] for r in summary["replays"]} == set(recorded)
    assert replay_keys(c, replays) == []  # not one real call, of any tool
    by_order = {r["recording"]["run_id"]: r for r in summary["replays"]}
    assert by_order["order-7"]["outcome"] == "matched"
    assert by_order["order-7"]["served"] == 3
    # The cheaper model: 3 turns of 110 input and 20 output tokens at half the price.
    assert by_order["order-7"]["delta"]["cost_usd"] == pytest.approx(
        3 * (110 * 1.0 + 20 * 4.0) / 1e6 - 3 * (100 * 2.0 + 20 * 8.0) / 1e6, abs=1e-6
    )
    listed = invoke("list", "--replay-of", "order-7", "--json")
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [
        by_order["order-7"]["replay"]["run_id"]
    ]

    # Again, with live reads: only the five lookups of another order are made.
    live = invoke(
        "replay", "--batch", "--agent", "desk-v2", "--from-agent", "desk", "--limit", "50",
        "--live-read-only", "--json",
    )  # fmt: skip
    assert live.exit_code == 0, live.output
    live_summary = json.loads(live.stdout)
    live_ids = {r["replay"]["run_id"] for r in live_summary["replays"]}
    made = replay_keys(c, live_ids)
    assert len(made) == 5 and all(k.endswith(":1") for k in made)
    assert {
        json.loads(invoke("show", k.split(":")[0], "--json").stdout)["status"] for k in made
    } == {"completed"}
    after = c.ledger()
    for key in before.by_key:  # the recordings' own calls: still once each
        assert after.calls(key) == 1
    assert len(after.by_key) == len(before.by_key) + 5

    # One replay, as text, and --strict for CI.
    strict = invoke("replay", "order-1", "--agent", "desk-v2", "--strict")
    assert strict.exit_code == EXIT_DIVERGED, strict.output
    text = strict.stdout
    assert "(desk -> desk-v2): diverged at step 3" in text
    assert "      - n: 1\n      + n: 1001\n" in text
    assert "-Order 1 was delivered. Refunding 1." in text
    assert invoke("replay", "order-3", "--agent", "desk-v2", "--strict").exit_code == 0
