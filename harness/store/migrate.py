"""Schema migrations (Alembic), applied by ``harness migrate``.

The embedded SQLite store migrates itself on first use, under a file lock so
that several workers starting together do not race; PostgreSQL is migrated
explicitly (``harness migrate``, the ``migrate`` service in compose).

Alembic is imported only to migrate: every command and worker checks the
store's revision as it opens it, and that check is one read of the version
table compared with :data:`HEAD` (kept equal to Alembic's head by a test),
so ``harness show`` does not pay for loading Alembic and its scripts.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, exc, inspect, text

from harness.errors import StoreError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
#: The newest revision under migrations/versions (tests/unit/test_imports.py
#: checks it against Alembic's head): bump it with each new migration.
HEAD = "0020"
#: Alembic's table of the applied revision.
VERSION_TABLE = "alembic_version"


def _config(engine: Engine) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


def head_revision() -> str:
    """The newest revision as Alembic reads it from the migration scripts."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config(None)).get_current_head()  # type: ignore[arg-type]
    assert head is not None
    return head


def shown(engine: Engine) -> str:
    """The engine's URL as a user may be shown it: its password masked, a
    relative SQLite path made absolute (the default is in the working folder)."""
    url = engine.url
    path = url.database
    if url.get_backend_name() == "sqlite" and path and not path.startswith(("/", ":", "file:")):
        url = url.set(database=str(Path(path).absolute()))
    return url.render_as_string(hide_password=True)


def current_revision(engine: Engine) -> str | None:
    """The store's schema revision (None: an empty database); :class:`StoreError`
    naming the store if it does not answer."""
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(VERSION_TABLE):
                return None
            found = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    except exc.OperationalError as err:
        reason = str(err.orig).splitlines()[0] if str(err.orig) else type(err.orig).__name__
        raise StoreError(f"cannot reach the run store {shown(engine)}: {reason}") from None
    if len(found) > 1:
        raise StoreError(f"the run store {shown(engine)} has several revisions: {found}")
    return found[0] if found else None


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
    current = current_revision(engine)
    if current != HEAD:
        _refuse_newer(engine, current)
        from alembic import command

        command.upgrade(_config(engine), "head")
    return HEAD


def downgrade(engine: Engine, revision: str) -> None:
    """Take the schema down to ``revision``: Alembic's downgrade through this
    package's scripts, newest first (a rollback, and the tests of a
    migration's round trip)."""
    from alembic import command

    command.downgrade(_config(engine), revision)


def _refuse_newer(engine: Engine, current: str | None) -> None:
    """StoreError if the store was migrated by a newer release than this code:
    its rows may hold what this code misreads (a revision can be a fence
    alone, as 0020 is), and this code has no script to migrate it."""
    if current is not None and current.isdigit() and int(current) > int(HEAD):
        raise StoreError(
            f"the run store at {shown(engine)} is at revision {current}, newer than "
            f"this code's {HEAD}: run this worker or command from the release that "
            "migrated it (or a newer one)"
        )


def ensure_current(engine: Engine, auto: bool) -> str:
    """Migrate (when ``auto``) or fail clearly if the schema is behind or
    ahead; the revision."""
    if auto:
        return upgrade(engine)
    current = current_revision(engine)
    if current != HEAD:
        _refuse_newer(engine, current)
        raise StoreError(
            f"the run store at {shown(engine)} is at "
            f"revision {current or 'none'}, not {HEAD}; run `harness migrate`"
        )
    return current


def check_store(engine: Engine) -> str:
    """The revision of the store behind ``engine`` if it answers and its schema
    is the newest; :class:`StoreError` naming the store otherwise. Changes
    nothing: an SQLite file that does not exist is not made (``harness health``)."""
    path = engine.url.database or ":memory:"
    on_disk = engine.dialect.name == "sqlite" and not path.startswith((":", "file:"))
    if on_disk and not Path(path).is_file():
        raise StoreError(
            f"no run store at {shown(engine)}: the file does not exist (the first "
            "worker or `harness start` with this HARNESS_DATABASE_URL makes it)"
        )
    return ensure_current(engine, auto=False)
