"""What the API's route modules share: who an action is recorded under, a
run id in a path, a sender's ``Idempotency-Key``, the error answers a route
documents."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body, Header
from fastapi import Path as PathParam

from harness.web import schemas

#: Who the API names as the operator when the body does not say.
API_OPERATOR = "api"

#: A run id in a path: text a column can hold (else 422).
RunId = Annotated[str, PathParam(), schemas.Storable]

#: A JSON body of any shape: a deferred call's result, a signal's data.
AnyBody = Annotated[Any, Body(description="Any JSON value")]

#: A sender's id for what it sends: a retry with the same key is received once.
SenderId = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=200,
        description="The sender's id: a retry with the same key is received once",
    ),
    schemas.Storable,
]

#: The error answers a route documents, by status code.
Problems = dict[int | str, dict[str, Any]]


def who(body: schemas.ByOperator) -> str:
    """The operator a decision is recorded under: the body's ``by``, else the API."""
    return body.by or API_OPERATOR
