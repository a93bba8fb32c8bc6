"""Answers to runs that wait on the world, and users' messages, over HTTP:
a deferred call completed, a signal, the next message (bearer-protected
like the rest of ``/api``), and the callback URLs deferred calls hand out
(no bearer: the signed token in the path is the authority)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam

from harness import api
from harness.engine.waits import Delivered
from harness.records import JSON
from harness.web import schemas
from harness.web.routing import API_OPERATOR, AnyBody, Problems, RunId, SenderId, who


def answer_routes(router: APIRouter, problems: Problems) -> None:
    """Answers to runs that wait on the world, from an operator or a
    system that holds the API token: a deferred call completed, a signal."""

    @router.post(
        "/runs/{run_id}/steps/{step}/complete", response_model=schemas.Delivered, responses=problems
    )
    def complete(
        run_id: RunId,
        step: Annotated[int, PathParam(ge=0, le=schemas.MAX_INT)],
        body: schemas.Complete,
    ) -> dict[str, JSON]:
        """Answer deferred call ``step`` with ``result`` or ``error``, once: an
        answer to a call answered already changes nothing (``changed`` false);
        one to a call still under way is kept until it defers."""
        operator = api.Operator(who(body))
        return operator.complete(run_id, step, result=body.result, error=body.error).to_dict()

    @router.post("/runs/{run_id}/messages", response_model=schemas.Sent, responses=problems)
    def message(
        run_id: RunId,
        body: schemas.Message,
        idempotency_key: SenderId = None,
    ) -> dict[str, JSON]:
        """The user's next message: a completed run goes on with it (a step of
        kind ``user``, then a model turn), a moving one gets it at its next model
        turn; a failed or cancelled run refuses it (409)."""
        sender = idempotency_key or None  # an empty header names no sender
        return api.Operator(API_OPERATOR).send(run_id, body.text, sender).to_dict()

    @router.post(
        "/runs/{run_id}/signals/{name}", response_model=schemas.Delivered, responses=problems
    )
    def signal(
        run_id: RunId,
        name: Annotated[str, PathParam(max_length=200)],
        data: AnyBody = None,
        idempotency_key: SenderId = None,
    ) -> dict[str, JSON]:
        """Send signal ``name`` with the body as its data: the oldest call
        deferred on that name takes it, or it is kept until one asks."""
        sender = idempotency_key or None  # an empty header names no sender
        return api.Operator(API_OPERATOR).signal(run_id, name, data, sender).to_dict()


def callback_routes(problems: Problems) -> APIRouter:
    """The callback URLs deferred calls hand out (``ctx.callback_url()``):
    no bearer token, the signed token in the path is the authority (the door
    lets ``/api/callbacks/`` in, its body limit still applies)."""
    router = APIRouter(prefix="/api", tags=["callbacks"])

    @router.post(
        "/callbacks/{token}",
        response_model=schemas.Delivered,
        responses=problems,
        openapi_extra={"security": []},
    )
    def callback(token: str, body: AnyBody = None) -> dict[str, JSON]:
        """Answer the deferred call the token names, once: the JSON body is
        its result (``{"error": "..."}``: it failed, the model is told). A
        repeat answers 200 with ``changed`` false; a forged token 401, an
        expired one 404; 503 when HARNESS_CALLBACK_SECRET is not set."""
        done: Delivered = api.answer_callback(token, body)
        return done.to_dict()

    return router
