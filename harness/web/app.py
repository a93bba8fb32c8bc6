"""The HTTP API and the dashboard: one FastAPI app over the read service.

Reads go through harness.reads (no agent code imported); actions through the
same functions as the command line (harness.api), so the API and ``harness``
act on a run in exactly the same way. Every answer is JSON, errors included:
a harness error becomes a 4xx with its message (or 503 when the store is
down), and anything unexpected a bare 500 whose traceback goes to the log,
never to the client. The dashboard's pages and scripts are files under
``static/``; the pages fetch this API with the login cookie.

Handlers are plain functions: FastAPI runs them in its thread pool, and the
store's connection pool is shared by those threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response, params
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from harness import api, compose
from harness.callbacks import BadToken, ExpiredToken
from harness.engine.operations import Acted
from harness.errors import (
    AgentNotFound,
    BadCursor,
    BadInput,
    ConfigError,
    DecisionConflict,
    HarnessError,
    InvalidToolArgs,
    NotResolvable,
    OperatorError,
    RunConflict,
    RunNotFound,
    StoreError,
    UnknownTool,
)
from harness.inputs import render_json
from harness.observability.metrics import exposition
from harness.reads import HISTORY_PAGE, MAX_PAGE, STEPS_PAGE, Reads, RunQuery, child_dict
from harness.records import JSON, Run, RunStatus
from harness.settings import Settings
from harness.web import agents, answers, auth, events, schemas
from harness.web.door import Door
from harness.web.routing import API_OPERATOR, Problems, RunId, who

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
Handler = TypeVar("Handler", bound=Callable[..., Any])
Name = Annotated[str | None, schemas.Storable]
#: An integer query holds at most what the store's integer columns hold (else 422).
MAX_INT = schemas.MAX_INT
#: A time in a query: a finite number of epoch seconds.
Epoch = Annotated[float | None, Query(allow_inf_nan=False, description="Epoch seconds")]

#: A harness error's HTTP status: the most specific class listed wins.
_STATUS: tuple[tuple[type[HarnessError], int], ...] = (
    (BadToken, 401),
    (ExpiredToken, 404),
    (RunNotFound, 404),
    (BadCursor, 400),
    (BadInput, 422),
    (AgentNotFound, 422),
    (InvalidToolArgs, 422),
    (UnknownTool, 422),
    (OperatorError, 409),
    (NotResolvable, 409),
    (StoreError, 503),
    (ConfigError, 503),
)


def _status_of(err: HarnessError) -> int:
    return next((code for kind, code in _STATUS if isinstance(err, kind)), 400)


def _problem(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _stored(data: JSON) -> Response:
    """An answer made of stored values, written as is: whatever a row holds
    (a value from before the doors' rules, NaN, deep nesting) never makes a
    read fail (harness.inputs.render_json), and pydantic does not walk it again."""
    return Response(render_json(data), media_type="application/json")


def _wants_html(request: Request) -> bool:
    return not request.url.path.startswith("/api/") and "text/html" in request.headers.get(
        "accept", ""
    )


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HarnessError)
    def harness_error(_: Request, err: HarnessError) -> JSONResponse:
        if isinstance(err, DecisionConflict | RunConflict):
            # What the run is, beside why nothing changed (or nothing was created).
            body = {"detail": str(err), "status": err.run.status.value}
            return JSONResponse(body, status_code=_status_of(err))
        return _problem(_status_of(err), str(err))

    @app.exception_handler(RequestValidationError)
    def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        if first.get("type") == "json_invalid":
            return _problem(422, "the body is not valid JSON")
        where = ".".join(str(part) for part in first.get("loc", ()))
        return _problem(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, err: StarletteHTTPException) -> Response:
        if err.status_code == 401 and _wants_html(request):
            return HTMLResponse(auth.login_page(), status_code=401)
        return _problem(err.status_code, str(err.detail), getattr(err, "headers", None))

    @app.exception_handler(Exception)
    def unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        return _problem(500, "internal error: the server log has the details")


def _problems(*codes: int) -> Problems:
    return {code: {"model": schemas.Problem} for code in codes}


def _listed(reads: Reads, run: Run) -> dict[str, JSON]:
    return reads.listed(run)


def _api_routes(reads: Reads, settings: Settings) -> APIRouter:
    """The JSON API under /api, in the order /openapi.json lists it."""
    router = APIRouter(prefix="/api", tags=["runs"])
    problems = _problems(400, 401, 403, 404, 409, 422, 503)
    _collection_routes(router, reads, problems)
    _run_routes(router, reads, problems)
    _operator_routes(router, reads, problems)
    answers.answer_routes(router, problems)
    events.event_routes(router, reads, settings.redis_url, problems)
    return router


def _collection_routes(router: APIRouter, reads: Reads, problems: Problems) -> None:
    """Start a run, list the runs a page at a time, the stats over them all."""

    @router.post(
        "/runs",
        status_code=201,
        response_model=schemas.RunCreated,
        responses={200: {"model": schemas.RunCreated, "description": "It existed"}, **problems},
    )
    def start_run(body: schemas.StartRun, response: Response) -> dict[str, JSON]:
        """Start a run; the same ``run_id`` again is a no-op answered 200, and
        with another agent or goal a 409."""
        started = api.start(body.agent, body.goal, body.run_id)
        if not started.created:
            response.status_code = 200
        return {"run_id": started.run_id}

    @router.get("/runs", response_model=schemas.RunPage, responses=problems)
    def list_runs(
        status: RunStatus | None = None,
        agent: Annotated[Name, Query(max_length=200)] = None,
        created_after: Epoch = None,
        created_before: Epoch = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        cursor: Annotated[str | None, Query(max_length=1000)] = None,
        forked_from: Annotated[Name, Query(max_length=128)] = None,
        replay_of: Annotated[Name, Query(max_length=128)] = None,
    ) -> Response:
        """Runs newest first, a page at a time; ``forked_from``: the forks of
        that run; ``replay_of``: its replays."""
        query = RunQuery(
            status,
            agent,
            created_before,
            created_after,
            limit,
            cursor,
            forked_from=forked_from,
            replay_of=replay_of,
        )
        page = reads.list_runs(query)
        runs = [_listed(reads, r) for r in page.runs]
        return _stored({"runs": runs, "next_cursor": page.next_cursor})

    @router.get("/stats", responses=problems)
    def stats() -> dict[str, JSON]:
        """The recovery counters and runs by status (``harness stats --json``)."""
        return reads.stats()


def _run_routes(router: APIRouter, reads: Reads, problems: Problems) -> None:
    """One run: its detail, its steps a window at a time, its history."""

    @router.get(
        "/runs/{run_id}",
        response_model=schemas.RunDetail | schemas.RunHeader,
        responses=problems,
    )
    def show(run_id: RunId, steps: bool = True) -> Response:
        """``harness show --json``; ``steps=false`` leaves the steps out (a
        long run's page), and keeps its ``children``."""
        if not steps:
            children = [child_dict(c) for c in reads.children(run_id)]
            return _stored({**_listed(reads, reads.run(run_id)), "children": children})
        return _stored(reads.run_detail(run_id).to_dict())

    @router.get("/runs/{run_id}/steps", response_model=schemas.StepPage, responses=problems)
    def steps_page(
        run_id: RunId,
        start: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = STEPS_PAGE,
    ) -> Response:
        """A window of the run's steps, in index order."""
        return _stored(reads.steps_page(run_id, start, limit).to_dict())

    @router.get("/runs/{run_id}/history", response_model=schemas.EventPage, responses=problems)
    def history(
        run_id: RunId,
        after: Annotated[
            int | None, Query(ge=0, le=MAX_INT, description="The last event id you have")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = HISTORY_PAGE,
    ) -> Response:
        """The run's flight recorder, oldest first, version by version."""
        page = reads.history(run_id, after, limit)
        events = [e.to_dict() for e in page.events]
        return _stored({"events": events, "next_after": page.next_after})


def _operator_routes(router: APIRouter, reads: Reads, problems: Problems) -> None:
    """The operator actions, each answering the run as it left it."""

    def action(path: str) -> Callable[[Handler], Handler]:
        """An operator action: it answers the run as the action left it, and
        whether it changed it (``changed`` false: the run had this very
        decision already); a 409 says what the run has instead."""
        return router.post(path, response_model=schemas.Acted, responses=problems)

    def acted(done: Acted) -> dict[str, JSON]:
        return {**_listed(reads, done.run), "changed": done.changed, "message": done.said}

    @action("/runs/{run_id}/cancel")
    def cancel(run_id: RunId, body: schemas.Cancel | None = None) -> dict[str, JSON]:
        """Stop the run; a step executing now finishes unrecorded."""
        return acted(api.Operator(API_OPERATOR).cancel(run_id, (body or schemas.Cancel()).reason))

    @action("/runs/{run_id}/resolve")
    def resolve(run_id: RunId, body: schemas.Resolve) -> dict[str, JSON]:
        """Settle the run's in-doubt step: retry it, or record it succeeded or failed."""
        operator = api.Operator(API_OPERATOR)
        return acted(operator.resolve(run_id, body.decision, body.result, body.force))

    @action("/runs/{run_id}/approve")
    def approve(run_id: RunId, body: schemas.Approve | None = None) -> dict[str, JSON]:
        """Approve the call the run waits on (optionally with edited arguments)."""
        body = body or schemas.Approve()
        return acted(api.Operator(who(body)).approve(run_id, body.step, body.args))

    @action("/runs/{run_id}/reject")
    def reject(run_id: RunId, body: schemas.Reject) -> dict[str, JSON]:
        """Reject the call the run waits on; the model is told the reason."""
        return acted(api.Operator(who(body)).reject(run_id, body.reason, body.step))

    @action("/runs/{run_id}/pause")
    def pause(run_id: RunId, body: schemas.Pause | None = None) -> dict[str, JSON]:
        """Hold the run at its next step boundary."""
        return acted(api.Operator(who(body or schemas.Pause())).pause(run_id))

    @action("/runs/{run_id}/resume")
    def resume(run_id: RunId, body: schemas.Resume | None = None) -> dict[str, JSON]:
        """Set a paused run moving, with its budgets raised if given."""
        body = body or schemas.Resume()
        operator = api.Operator(who(body))
        return acted(operator.resume(run_id, body.max_tokens, body.max_cost_usd, body.max_steps))


def _page_routes(guard: auth.Guard, app: FastAPI) -> None:
    """The dashboard: a login that sets the cookie, two pages, their files."""
    files = {p.name: p for p in STATIC.glob("*") if p.is_file()} if STATIC.is_dir() else {}
    authorized = Depends(auth.dependency(guard))

    def logged_in(request: Request, token: str | None) -> Response:
        if token is None:
            return HTMLResponse(auth.login_page())
        if not guard.matches(token):
            return HTMLResponse(auth.login_page("That token is not the right one."), 401)
        response = RedirectResponse("/", status_code=303)
        # Secure behind an HTTPS proxy (whose X-Forwarded-Proto uvicorn believes).
        secure = request.url.scheme == "https"
        response.set_cookie(auth.COOKIE, token, httponly=True, samesite="strict", secure=secure)
        return response

    @app.get("/login", include_in_schema=False)
    def login_link(
        request: Request, token: Annotated[str | None, Query(max_length=1000)] = None
    ) -> Response:
        """The login URL ``harness serve`` prints (the access log redacts its token)."""
        return logged_in(request, token)

    @app.post("/login", include_in_schema=False)
    async def login_form(request: Request) -> Response:
        """The form's login: the token travels in the body, never in a URL.
        The door lets a few kilobytes of body through, no more."""
        body = (await request.body()).decode("utf-8", "replace")
        token = parse_qs(body).get("token", [None])[0]
        if token is None:
            return HTMLResponse(auth.login_page("A token is needed."), 401)
        return logged_in(request, token)

    def page(name: str) -> FileResponse:
        if name not in files:
            raise StarletteHTTPException(404, "the dashboard's files are missing")
        return FileResponse(files[name], headers={"Cache-Control": "no-cache"})

    @app.get("/", include_in_schema=False, dependencies=[authorized])
    def runs_page() -> FileResponse:
        return page("index.html")

    @app.get("/runs/{run_id}", include_in_schema=False, dependencies=[authorized])
    def run_page(run_id: str) -> FileResponse:
        return page("run.html")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:
        """The tab's icon (an SVG; open, as the login page shows it too)."""
        return page("favicon.svg")

    @app.get("/static/{name}", include_in_schema=False, dependencies=[authorized])
    def static_file(name: str) -> FileResponse:
        return page(name)  # only the files of static/ by name: no path walks out of it


def _operations_routes(
    app: FastAPI, service: Reads, settings: Settings, authorized: params.Depends
) -> None:
    """What a supervisor, Prometheus and a client generator read: /healthz
    (open), /metrics and /openapi.json (behind the token)."""

    @app.get(
        "/healthz",
        response_model=schemas.Health,
        tags=["operations"],
        responses={503: {"model": schemas.Health, "description": "The store does not answer"}},
    )
    def healthz() -> JSONResponse:
        """Whether the run store answers (``SELECT 1``: a probe that cannot
        load the database however many runs it holds). No token needed."""
        try:
            service.store.ping()
        except HarnessError as err:
            log.warning("health check: the store does not answer: %s", err)
            return JSONResponse({"ok": False, "store": "unreachable"}, status_code=503)
        return JSONResponse({"ok": True, "store": "ok"})

    @app.get(
        "/metrics",
        tags=["operations"],
        dependencies=[authorized],
        responses={
            200: {
                "description": "The Prometheus text format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **_problems(401, 403, 503),
        },
    )
    def metrics() -> Response:
        """Prometheus text: steps, durations, recovery counters, runs by status."""
        body, content_type = exposition(service, settings)
        return Response(body, media_type=content_type)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[authorized])
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())


def create_app(token: str, reads: Reads | None = None, settings: Settings | None = None) -> FastAPI:
    """The app, answering only requests that carry ``token``.

    ``reads``: the read service to use, and ``settings`` (default: this
    process's, from its composition root, harness.compose, as the CLI's).
    """
    settings = settings or compose.settings()
    guard = auth.Guard(token)
    app = FastAPI(
        title="harness",
        summary="Durable LLM agent runs on Celery: runs, their steps and history, operator actions",
        version="1",
        # The interactive docs load scripts from a CDN: none here. /openapi.json needs the token.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    _install_error_handlers(app)
    app.add_middleware(
        Door,
        guard=guard,
        max_body=settings.api_max_body,
        callback_secret=settings.callback_secret,
    )
    authorized = Depends(auth.dependency(guard))
    service = reads or compose.reads()
    _operations_routes(app, service, settings, authorized)
    app.include_router(_api_routes(service, settings), dependencies=[authorized])
    app.include_router(answers.callback_routes(_problems(401, 404, 409, 413, 422, 503)))
    agents.install(app, service, authorized)
    _page_routes(guard, app)
    return app
