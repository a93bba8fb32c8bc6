"""The migrations build exactly the schema that harness.store.schema declares."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from harness.store import schema
from harness.store.sql import make_engine


def test_migrated_database_matches_the_declared_schema(database_url: str) -> None:
    engine = make_engine(database_url)  # the fixture has run every migration
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), schema.metadata)
    finally:
        engine.dispose()
    assert diff == []
