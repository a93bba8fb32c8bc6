"""The tools a run was offered (``harness_run_tools``, harness.toolsets)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import Delete, Insert, Select

from harness.store.schema.tables import run_tools


def insert_run_tools_if_absent(dialect: str, values: dict[str, Any]) -> Insert:
    """First writer wins: a run's record of its tools is never changed."""
    if dialect == "postgresql":
        return postgresql.insert(run_tools).values(**values).on_conflict_do_nothing()
    return sqlite.insert(run_tools).values(**values).on_conflict_do_nothing()


def insert_run_tools() -> Insert:
    """An imported run's record (harness.runs.archive): a new run, so no conflict."""
    return insert(run_tools)


def select_run_tools(run_id: str) -> Select[Any]:
    return select(run_tools.c.tools).where(run_tools.c.run_id == run_id)


def delete_run_tools(run_ids: list[str]) -> Delete:
    """Forget the records of these (deleted) runs."""
    return delete(run_tools).where(run_tools.c.run_id.in_(run_ids))
