"""Schema migrations (Alembic), applied by ``harness migrate``.

The embedded SQLite store migrates itself on first use, under a file lock so
that several workers starting together do not race; PostgreSQL is migrated
explicitly (``harness migrate``, the ``migrate`` service in compose).
"""

from __future__ import annotations

import fcntl
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, exc

from harness.errors import StoreError

MIGRATIONS = Path(__file__).with_name("migrations")


def _config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config(None)).get_current_head()  # type: ignore[arg-type]
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except exc.OperationalError as err:
        raise StoreError(f"cannot reach the run store: {str(err.orig).splitlines()[0]}") from None


def upgrade(engine: Engine) -> str:
    """Bring the schema to the newest revision; return it."""
    if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        lock_path = Path(f"{engine.url.database}.migrate-lock")
        try:
            lock = open(lock_path, "w")  # noqa: SIM115 - closed by the with below
        except OSError as err:
            raise StoreError(
                f"cannot open the SQLite run store at {engine.url.database}: {err.strerror}"
            ) from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return _upgrade(engine)
    return _upgrade(engine)


def _upgrade(engine: Engine) -> str:
    head = head_revision()
    if current_revision(engine) != head:
        command.upgrade(_config(engine), "head")
    return head


def ensure_current(engine: Engine, auto: bool) -> None:
    """Migrate (when ``auto``) or fail clearly if the schema is behind."""
    if auto:
        upgrade(engine)
        return
    current = current_revision(engine)
    if current != head_revision():
        raise StoreError(
            f"the run store at {engine.url.render_as_string(hide_password=True)} is at "
            f"revision {current or 'none'}, not {head_revision()}; run `harness migrate`"
        )
