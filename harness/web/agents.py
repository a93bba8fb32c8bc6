"""The agent catalog over HTTP: ``GET /api/agents`` and the dashboard's
agents page (harness.catalog): the agents live workers carry, their tools,
and the workers carrying them, a mixed release marked. Bearer-protected like
the rest of ``/api``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.params import Depends
from fastapi.responses import FileResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from harness import catalog
from harness.reads import Reads
from harness.records import JSON
from harness.web import schemas

#: The dashboard's agents page, beside its other files.
PAGE = Path(__file__).parent / "static" / "agents.html"


class ToolOut(BaseModel):
    name: str
    effect: str
    requires_approval: bool


class WorkerOut(BaseModel):
    name: str
    last_seen: float  # epoch seconds
    definition_hash: str


class AgentOut(BaseModel):
    """An agent some live worker carries: the definition and tools of the
    worker that started last; each worker's own hash in ``workers``."""

    name: str
    tools: list[ToolOut]
    definition_hash: str
    mixed_release: bool
    workers: list[WorkerOut]


def install(app: FastAPI, reads: Reads, authorized: Depends) -> None:
    """Add the catalog's endpoint and page to ``app``, behind ``authorized``."""
    problems: dict[int | str, dict[str, Any]] = {
        code: {"model": schemas.Problem} for code in (401, 403, 503)
    }

    @app.get(
        "/api/agents",
        response_model=list[AgentOut],
        tags=["agents"],
        dependencies=[authorized],
        responses=problems,
    )
    def list_agents() -> list[dict[str, JSON]]:
        """The agents live workers carry (``harness agents --json``), by name."""
        listed = catalog.live_agents(reads.store, reads.clock.now())
        return [entry.to_dict() for entry in listed]

    @app.get("/agents", include_in_schema=False, dependencies=[authorized])
    def agents_page() -> FileResponse:
        if not PAGE.is_file():
            raise StarletteHTTPException(404, "the dashboard's files are missing")
        return FileResponse(PAGE, headers={"Cache-Control": "no-cache"})
