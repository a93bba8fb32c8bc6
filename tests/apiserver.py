"""A real ``harness serve`` process for API and dashboard tests.

Started with ``--port 0``: the server binds a free port before it prints its
URL, so the port is read from its first line and never guessed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

HARNESS = str(Path(sys.executable).parent / "harness")
_URL = re.compile(r"(http://127\.0\.0\.1:\d+)")


class ApiServer:
    """``harness serve`` in a subprocess, with the given environment."""

    def __init__(self, env: dict[str, str], cwd: Path, token: str | None = "test-token") -> None:
        env = dict(env)
        if token is not None:
            env["HARNESS_API_TOKEN"] = token
        self.token = token
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [HARNESS, "serve", "--host", "127.0.0.1", "--port", "0"],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._ready = threading.Event()
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(30) or not self.url:
            self.stop()
            raise AssertionError("harness serve did not start:\n" + self.output)
        self._wait_healthy()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            found = _URL.search(line)
            if found and not self.url:
                self.url = found.group(1)
                self._ready.set()
        self._ready.set()  # it exited

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("harness serve never answered /healthz:\n" + self.output)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def client(self, token: str | None = None, *, anonymous: bool = False) -> httpx.Client:
        """A client that sends ``token`` (default: the server's) as a bearer
        token, or none at all if ``anonymous``."""
        token = None if anonymous else token or self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
