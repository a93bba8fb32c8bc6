"""The rows of ``make bench`` (bench.suite) and the table it prints.

Kept apart from the suite so that a benchmark module can hand the suite its
rows ready made (bench.agentloop does) without importing the suite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    what: str
    value: float
    unit: str
    baseline: float | None = None  # what the value is divided by, in the same unit
    goal: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.baseline is None else self.value / self.baseline


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        ratio = "" if row.ratio is None else f"  ratio {row.ratio:.2f}x"
        print(f"  {row.what}: {row.value:.3f} {row.unit}{ratio} {row.note}", flush=True)


def table(results: Results) -> str:
    lines = [
        f"{'measurement':<72} {'value':>12} {'ratio':>7}  goal",
        "-" * 100,
    ]
    for row in results.rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        value = f"{row.value:.2f} {row.unit}"
        lines.append(f"{row.what:<72} {value:>12} {ratio:>7}  {row.goal}")
    return "\n".join(lines)
