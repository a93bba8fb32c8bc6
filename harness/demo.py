"""``harness demo``: kill a real worker in the middle of a tool call.

Runs on the embedded default (SQLite + the filesystem broker) under
``.harness/demo``, leaving any other data alone. Exit status 0 when the run
completed with exactly one refund in the ledger.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from harness import api
from harness.celery.process import WorkerProcess
from harness.records import Run, Step, StepStatus

LEASE_TTL = "3"
SWEEP_INTERVAL = "1"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _summary(steps: list[Step]) -> str:
    return "[" + ", ".join(f"({s.index}, {s.kind}, {s.status})" for s in steps) + "]"


def _wait(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.05)


def run_demo(kill_delay: float = 0.0) -> int:
    """Start a refund run, SIGKILL its worker while the refund call runs,
    start another worker with the sweeper, and show the run recover with one
    refund. 0 if it did, 1 if not."""
    home = Path(".harness/demo").absolute()
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = _demo_environment(home)
    os.environ.update(env)
    api.reset_runtime()
    say = print
    say("== durable agent harness: crash demo on the embedded default (no services) ==")
    say(
        f"store sqlite:///{home / 'harness.db'}, broker filesystem://, "
        f"lease TTL {LEASE_TTL}s, sweep every {SWEEP_INTERVAL}s\n"
    )
    first = WorkerProcess("demo-a", env, home).wait_ready()
    second: WorkerProcess | None = None
    try:
        say(f"[1] worker A started (pid {first.pid})")
        run_id = api.start_run("support-bot", "refund order 1234")
        say(f"[2] run {run_id} started: support-bot, goal 'refund order 1234'")
        killed_at = _kill_mid_refund(run_id, first, home, kill_delay)
        second = WorkerProcess(
            "demo-b", env, home, extra=["-B", "--schedule", str(home / "beat-schedule")]
        ).wait_ready()
        say(f"[5] worker B started (pid {second.pid}) with the sweeper (celery beat)")
        return 0 if _recovered(run_id, home, killed_at) else 1
    finally:
        first.kill()
        if second is not None:
            second.stop()


def _demo_environment(home: Path) -> dict[str, str]:
    """This process's environment without its ``HARNESS_*`` variables, with
    the demo's: a store and broker of its own under ``home``, a short lease."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")},
        "HARNESS_HOME": str(home),
        "HARNESS_DATABASE_URL": f"sqlite:///{home / 'harness.db'}",
        "HARNESS_IMPORTS": "harness.examples",
        "HARNESS_LEASE_TTL": LEASE_TTL,
        "HARNESS_SWEEP_INTERVAL": SWEEP_INTERVAL,
    }


def _kill_mid_refund(run_id: str, worker: WorkerProcess, home: Path, kill_delay: float) -> float:
    """SIGKILL ``worker`` once the refund call is under way (``kill_delay``
    seconds later), and show the state it left; when it was killed."""
    say = print
    ledger, attempts = home / "ledger.txt", home / "attempts.txt"

    def refund_running() -> bool:
        run = api.get_run(run_id)
        current = run.current
        return (
            current is not None
            and current.tool == "issue_refund"
            and current.status is StepStatus.RUNNING
            and bool(_lines(attempts))
        )

    _wait("the refund step", refund_running, 30)
    time.sleep(kill_delay)
    worker.kill()
    killed_at = time.monotonic()
    run = api.get_run(run_id)
    say(f"[3] step {run.cursor} (issue_refund) is RUNNING in worker A: SIGKILL pid {worker.pid}")
    say("[4] state found after the crash:")
    say(f"      {_summary(api.get_steps(run_id))} | version: {run.version}")
    lease_left = (run.lease_expires_at or 0) - time.time()
    say(
        f"      lease held by the dead worker for {lease_left:.1f}s more; "
        f"ledger entries: {len(_lines(ledger))}; refund attempts: {len(_lines(attempts))}"
    )
    return killed_at


def _recovered(run_id: str, home: Path, killed_at: float) -> bool:
    """Wait for the run to end and show how it recovered; True if it
    completed with exactly one refund in the ledger."""
    say = print
    ledger, attempts = home / "ledger.txt", home / "attempts.txt"
    final: Run = api.wait_for(run_id, timeout=60)
    recovered_in = time.monotonic() - killed_at
    steps = api.get_steps(run_id)
    say(f"[6] run {final.status} {recovered_in:.1f}s after the kill: {final.result!r}")
    say(f"      {_summary(steps)} | version: {final.version}")
    refund = next(s for s in steps if s.tool == "issue_refund")
    say(
        f"      refund step attempts: {refund.attempts}; refund invocations: "
        f"{len(_lines(attempts))}; REAL side effects (ledger entries): {len(_lines(ledger))}"
    )
    events = api.runtime().store.events(run_id)
    for e in events:
        if e.to_status in ("lease_takeover", "recovered_running", "redispatched"):
            say(f"      flight recorder v{e.version}: {e.to_status} ({e.detail})")
    ok = final.status == "completed" and len(_lines(ledger)) == 1
    say("\nOK: one refund, despite the crash." if ok else "\nFAILED: see above.")
    say(
        f"Inspect it: HARNESS_DATABASE_URL=sqlite:///{home / 'harness.db'} harness history {run_id}"
    )
    return ok
