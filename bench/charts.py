"""The suite's charts (matplotlib, the ``bench`` extra): False when it is
not installed or the results have nothing to draw."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.results import Results


def step_cost(results: Results, path: Path) -> bool:
    """Cost per step along the long run, against the bare hop and the goal."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    points = results.series.get("step_cost_ms", [])
    if not points:
        return False
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([p for p, _ in points], [v for _, v in points], marker=".", label="harness step")
    hop = results.extra.get("hop_ms_redis")
    if hop:
        ax.axhline(hop, color="grey", linestyle="--", label="bare Celery hop")
    floor = results.extra.get("floor_ms_redis")
    if floor:
        ax.axhline(floor, color="black", linestyle="--", label="the floor (bench.floor_hop)")
        ax.axhline(1.15 * floor, color="red", linestyle=":", label="goal: 1.15x the floor")
    ax.set_xlabel("step index in the run")
    ax.set_ylabel("ms per step")
    ax.set_ylim(bottom=0)
    ax.set_title("Cost per step along one run (Redis broker, PostgreSQL, one worker)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def growth(results: Results, path: Path) -> bool:
    """Throughput against concurrency, one line per run length, and the bare hop's."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    every = results.extra.get("growth", {}).get("cells", [])
    cells = [c for c in every if not c["skipped"]]
    if not cells:
        return False
    fig, ax = plt.subplots(figsize=(8, 4))
    for length in sorted({c["length"] for c in cells}):
        line = sorted((c["concurrency"], c["steps_per_s"]) for c in cells if c["length"] == length)
        ax.plot(*zip(*line, strict=True), marker="o", label=f"harness, runs of {length} steps")
    hops = sorted({(c["concurrency"], 1000 / c["hop_ms"]) for c in every})
    ax.plot(*zip(*hops, strict=True), color="grey", linestyle="--", marker=".", label="bare hop")
    ax.set_xscale("log")
    ax.set_xlabel("runs at once")
    ax.set_ylabel("steps (hops) per second")
    ax.set_ylim(bottom=0)
    workers = results.extra["growth"]["workers"]
    ax.set_title(f"Throughput against concurrency (Redis, PostgreSQL, {workers} workers)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def goals(results: Results, path: Path) -> bool:
    """Each ratio that has a goal in ratios (``<= 1.15x``, ``>= 0.9x``):
    the measured ratio as a bar, the goal as a tick on it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    marks = []
    for row in results.rows:
        found = re.fullmatch(r"([<>]=) ([\d.]+)x", row.goal)
        if found and row.ratio is not None:
            marks.append((row.what, row.ratio, float(found[2]), found[1] == "<="))
    if not marks:
        return False
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(marks) + 1.2))
    places = range(len(marks))
    met = [(ratio <= goal) if below else (ratio >= goal) for _, ratio, goal, below in marks]
    ax.barh(
        places,
        [ratio for _, ratio, _, _ in marks],
        color=["tab:green" if m else "tab:orange" for m in met],
    )
    ax.scatter([goal for _, _, goal, _ in marks], places, marker="|", s=300, color="black")
    ax.set_yticks(list(places), [what for what, _, _, _ in marks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to the row's baseline (black tick: the goal; green: met)")
    ax.set_title("make bench: each ratio against its goal, same run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
