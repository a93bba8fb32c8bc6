"""Real ``celery -A tasks worker`` processes, started and killed on purpose.

Used by ``harness demo`` and by the integration and chaos tests: a worker is
a subprocess whose log goes to a file; it is ready when Celery logs "ready.".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class WorkerProcess:
    """One ``celery worker`` subprocess."""

    def __init__(self, name: str, env: Mapping[str, str], log_dir: Path,
                 extra: Sequence[str] = (), cwd: Path | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"worker-{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "celery", "-A", "tasks", "worker",
                   "--loglevel=INFO", "-n", f"{name}@%h", "--without-gossip",
                   "--without-mingle", "--without-heartbeat", *extra]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(command, env=dict(env), stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=cwd,
                                     start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited ({self.proc.returncode}):\n"
                                   f"{self.log()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"worker {self.name} not ready after {timeout}s:\n{self.log()[-3000:]}")

    def children(self) -> list[int]:
        """Pool child pids (none with the solo pool)."""
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def kill(self) -> None:
        """SIGKILL the whole worker: the main process and every pool child."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown; SIGKILL if it does not finish in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
