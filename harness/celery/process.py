"""Real ``celery -A tasks worker`` (and ``beat``) processes, started and killed on purpose.

Used by ``harness demo`` and by the integration and chaos tests: a worker is
a subprocess whose log goes to a file; it is ready when Celery logs "ready.".
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class WorkerProcess:
    """One ``celery worker`` subprocess (or ``celery beat``, with ``beat=True``) of
    the Celery app ``app`` (``celery -A app``)."""

    def __init__(
        self,
        name: str,
        env: Mapping[str, str],
        log_dir: Path,
        extra: Sequence[str] = (),
        cwd: Path | None = None,
        beat: bool = False,
        app: str = "tasks",
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{'beat' if beat else 'worker'}-{name}.log"
        self.ready_mark = "beat: Starting" if beat else " ready."
        log_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "celery", "-A", app]
        if beat:
            command += ["beat", "--loglevel=INFO", "--schedule", str(log_dir / f"{name}-sched")]
        else:
            command += [
                "worker",
                "--loglevel=INFO",
                "-n",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        command += extra
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            command,
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_mark in self.log():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"worker {self.name} exited ({self.proc.returncode}):\n{self.log()[-3000:]}"
                )
            time.sleep(0.05)
        raise TimeoutError(f"worker {self.name} not ready after {timeout}s:\n{self.log()[-3000:]}")

    def children(self) -> list[int]:
        """Pool child pids (none with the solo pool)."""
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def kill(self) -> dict[int, float]:
        """SIGKILL the whole worker, main process and pool children alike.

        Returns ``{pid: when}`` for every process this killed (or found dead).
        """
        pids = [self.pid, *self.children()]
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()
        now = time.time()
        return dict.fromkeys(pids, now)

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown; SIGKILL if it does not finish in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill()
