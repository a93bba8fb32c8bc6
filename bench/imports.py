"""What a command pays before it does anything: the import and the CLI's start.

    python -m bench.imports [--rounds 5] [--root CHECKOUT]

Wall time of fresh interpreters, median of ``--rounds``: ``python -c "import
harness"``, ``harness --help``, and ``harness show RUN`` on an SQLite store
holding one finished demo run (``harness demo`` makes it first, in a
temporary folder); plus the modules ``import harness`` loads and the
Python start-up alone (``python -c pass``), the floor of every figure. Run it
on two checkouts (``--root``) to compare them; a machine's noise moves every
figure together, so read the differences, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _wall(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    began = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - began


def median_ms(argv: list[str], env: dict[str, str], cwd: Path, rounds: int) -> float:
    """The median wall time of ``argv`` in ms, after one untimed run (a warm disk cache)."""
    _wall(argv, env, cwd)
    return statistics.median(_wall(argv, env, cwd) for _ in range(rounds)) * 1000


def _demo_run(cli: list[str], env: dict[str, str], cwd: Path) -> str:
    """A finished run on the demo's SQLite store, which ``env`` then names."""
    subprocess.run([*cli, "demo"], env=env, cwd=cwd, check=True, capture_output=True)
    env["HARNESS_DATABASE_URL"] = f"sqlite:///{cwd / '.harness/demo/harness.db'}"
    listed = subprocess.run(
        [*cli, "list", "--json"], env=env, cwd=cwd, check=True, capture_output=True, text=True
    )
    return str(json.loads(listed.stdout)[0]["run_id"])


def main(root: Path, rounds: int) -> dict[str, float]:
    python = sys.executable
    cli = [python, "-c", "from harness.cli import main; main()"]
    with tempfile.TemporaryDirectory(prefix="bench-imports-") as folder:
        here = Path(folder)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
        env["PYTHONPATH"] = str(root)
        modules = subprocess.run(
            [python, "-c", "import sys, harness; print(len(sys.modules))"],
            env=env,
            cwd=here,
            check=True,
            capture_output=True,
            text=True,
        )
        figures = {
            "python_start_ms": median_ms([python, "-c", "pass"], env, here, rounds),
            "import_harness_ms": median_ms([python, "-c", "import harness"], env, here, rounds),
            "modules_after_import": float(modules.stdout),
            "help_ms": median_ms([*cli, "--help"], env, here, rounds),
        }
        run_id = _demo_run(cli, env, here)
        figures["show_ms"] = median_ms([*cli, "show", run_id], env, here, rounds)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    for name, value in main(args.root.resolve(), args.rounds).items():
        print(f"{name:22} {value:8.0f}")
