"""``python -m bench.blobs``: a run with large tool outputs, blobs off and on.

Writes one run of STEPS tool steps, each returning about KB kilobytes of JSON
(with its idempotency record, as the runner writes it: one checkpoint per
step), into a fresh store per configuration: blobs off (every result in its
row), blobs in the table ``harness_blobs`` (the default, above 64 KiB) and
blobs in a directory. Then it times ``store.load`` (the step task's read)
and ``store.steps`` (the whole history: ``harness show``, the model's
context), and says how large the run's rows are. Same process, side by side,
printed as ratios against blobs off. A measurement, not a test.

    python -m bench.blobs [STEPS] [KB]
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.common import fresh_postgres
from harness.engine import transitions
from harness.records import RunStatus, Step, StepKind, StepStatus
from harness.store import Checkpoint, RunPatch, ToolRecord
from harness.store.blobs import BlobStore
from harness.store.migrate import upgrade
from harness.store.sql import SQLStore, make_engine

PG_BASE = "postgresql+psycopg://postgres@127.0.0.1:5432/harness_bench_blobs"
RUN = "bench-blobs"
#: Rounds of reads, each timing every configuration in turn.
ROUNDS = 7
#: Loads timed per round (their median).
LOADS = 50


def output(step: int, kb: int) -> dict[str, Any]:
    """A tool's output of about ``kb`` KB: rows of ids and text, as an API or a
    search returns, random enough that the database cannot compress it away."""
    rng = random.Random(step)
    rows = [
        {"id": i, "name": f"item {step}-{i}", "text": rng.randbytes(32).hex()}
        for i in range(kb * 1000 // 110)
    ]
    return {"step": step, "rows": rows}


def step_checkpoint(store: SQLStore, index: int, last: bool, kb: int) -> Checkpoint:
    """What the runner writes when tool step ``index`` returns: the step, its
    record, the cursor moved (and, after the last, the model's next turn)."""
    result = output(index, kb)
    done = Step(RUN, index, StepKind.TOOL, StepStatus.DONE, 1, tool="fetch", result=result)
    turn = Step(RUN, index + 1, StepKind.MODEL, StepStatus.PENDING)
    return Checkpoint(
        RUN,
        store.load(RUN).version,
        "bench",
        time.time(),
        run=RunPatch(status=RunStatus.RUNNING, cursor=index + 1, step_count=index + 1 + last),
        new_steps=(done, turn) if last else (done,),
        tool_record=ToolRecord(f"{RUN}:{index}", index, "fetch", result),
    )


def timed(work: Callable[[], object], times: int) -> float:
    """Median milliseconds of ``work``."""
    took = []
    for _ in range(times):
        started = time.perf_counter()
        work()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def row_bytes(store: SQLStore) -> tuple[int, int]:
    """Bytes of the steps and tool records, and of the blobs (table or files)."""
    files = 0
    if store.blobs.directory is not None:
        files = sum(p.stat().st_size for p in store.blobs.directory.rglob("*.json"))
    with store.engine.connect() as conn:
        if store.dialect == "postgresql":
            size = "pg_total_relation_size"
            rows = conn.execute(
                text(
                    f"SELECT {size}('harness_steps') + {size}('harness_tool_results'), "
                    f"{size}('harness_blobs')"
                )
            ).one()
            return int(rows[0]), int(rows[1]) + files
        rows = conn.execute(
            text(
                "SELECT (SELECT coalesce(sum(length(result) + length(args)), 0) FROM harness_steps)"
                " + (SELECT coalesce(sum(length(result)), 0) FROM harness_tool_results),"
                " (SELECT coalesce(sum(length(data)), 0) FROM harness_blobs)"
            )
        ).one()
        return int(rows[0]), int(rows[1]) + files


def open_store(url: str, blobs: BlobStore) -> SQLStore:
    """A migrated store holding the run's first step."""
    engine = make_engine(url)
    upgrade(engine)
    store = SQLStore(engine, blobs=blobs)
    run, first = transitions.new_run(RUN, "bench", "large outputs", time.time())
    store.create_run(run, first, run.created_at, transitions.created(run))
    return store


def measure(urls: dict[str, tuple[str, BlobStore]], steps: int, kb: int) -> dict[str, Any]:
    """Every configuration's figures. Writes and reads are interleaved, each
    configuration in turn, so the machine's state weighs on all alike."""
    stores = {name: open_store(url, blobs) for name, (url, blobs) in urls.items()}
    times: dict[tuple[str, str], list[float]] = {}
    for index in range(1, steps + 1):
        for name, store in stores.items():
            checkpoint = step_checkpoint(store, index, index == steps, kb)
            took = timed(lambda s=store, c=checkpoint: s.checkpoint(c), 1)
            times.setdefault((name, "checkpoint"), []).append(took)
    for store in stores.values():
        history = store.steps(RUN)
        assert len(history) == steps + 2 and history[steps].result == output(steps, kb)
        if store.dialect == "postgresql":
            with store.engine.connect() as conn:
                conn.exec_driver_sql("VACUUM ANALYZE")
    for _ in range(ROUNDS):
        for name, store in stores.items():
            load = timed(lambda s=store: s.load(RUN), LOADS)
            times.setdefault((name, "load"), []).append(load)
            history = timed(lambda s=store: s.steps(RUN), 1)
            times.setdefault((name, "steps"), []).append(history)
    figures = {}
    for name, store in stores.items():
        rows, blobs = row_bytes(store)
        figures[name] = {
            **{t: statistics.median(times[(name, t)]) for t in ("checkpoint", "load", "steps")},
            "rows": rows,
            "blobs": blobs,
        }
        store.close()
    return figures


def report(name: str, configs: dict[str, dict[str, float]]) -> None:
    """One line per configuration; times with their ratio to blobs off."""
    off = configs["blobs off"]
    print(f"{name}:")
    header = ("checkpoint", "load", "steps", "rows", "blobs")
    print(f"  {'':10}" + "".join(f"{h:>20}" for h in header))
    for config, f in configs.items():
        cells = [f"{f[t]:.3f} ms ({f[t] / off[t]:.2f}x)" for t in ("checkpoint", "load", "steps")]
        cells += [f"{f['rows'] / 1e6:.1f} MB", f"{f['blobs'] / 1e6:.1f} MB"]
        print(f"  {config:10}" + "".join(f"{c:>20}" for c in cells))


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    kb = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    size = len(json.dumps(output(1, kb)))
    print(f"one run of {steps} tool steps, each returning {size:,} bytes of JSON")
    with tempfile.TemporaryDirectory() as tmp:
        configs = {
            "blobs off": BlobStore(None),
            "table": BlobStore(),
            "directory": BlobStore(directory=Path(tmp) / "blobs"),
        }
        sqlite = {
            name: (f"sqlite:///{Path(tmp) / f'{i}.db'}", blobs)
            for i, (name, blobs) in enumerate(configs.items())
        }
        report("SQLite (WAL)", measure(sqlite, steps, kb))
        postgres = {}
        for i, (name, blobs) in enumerate(configs.items()):
            fresh_postgres(f"{PG_BASE}_{i}")
            postgres[name] = (f"{PG_BASE}_{i}", blobs)
        report("PostgreSQL", measure(postgres, steps, kb))
    print("rows: the steps and tool records (SQLite: their JSON text; PostgreSQL: the")
    print("tables with their TOAST and indexes); blobs: the harness_blobs table, or the files")


if __name__ == "__main__":
    main()
