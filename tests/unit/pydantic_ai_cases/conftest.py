"""The Pydantic AI cases' fixtures: the embedded store; a live run kept, or
re-run each step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import api
from harness.pydantic_agents import live


@pytest.fixture(autouse=True)
def embedded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    from tests.unit.pydantic_ai_cases import common

    monkeypatch.setenv("HARNESS_DATABASE_URL", f"sqlite:///{tmp_path / 'harness.db'}")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    common.CALLS.clear()
    api.reset_runtime()
    yield
    api.reset_runtime()


@pytest.fixture(params=["kept-live", "rerun-each-step"])
def kept(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "rerun-each-step":
        monkeypatch.setattr(live, "KEPT", 0)
    return str(request.param)
