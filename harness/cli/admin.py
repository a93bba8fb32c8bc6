"""Setting up and showing: migrate the store, serve the HTTP API, run the demo.

Each imports its heavy module (Alembic's migrations, the web stack, the
demo's worker) in its own body.
"""

from __future__ import annotations

import sys

import click

from harness import compose
from harness.cli.support import Seconds, friendly


@click.command()
@friendly
def migrate() -> None:
    """Create or upgrade the run store's schema (HARNESS_DATABASE_URL)."""
    from harness.store.migrate import shown, upgrade
    from harness.store.sql import make_engine

    settings = compose.settings()
    engine = make_engine(settings.database_url)
    try:
        revision = upgrade(engine)
    finally:
        engine.dispose()
    click.echo(f"run store at revision {revision}: {shown(engine)}")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@friendly
def serve(host: str, port: int) -> None:
    """Serve the HTTP API and the run dashboard (token: HARNESS_API_TOKEN)."""
    from harness.web import server

    server.serve(compose.settings(), host, port, announce=click.echo)


@click.command()
@click.option(
    "--kill-delay", default=0.0, type=Seconds(), help="Extra seconds to wait before the SIGKILL."
)
@friendly
def demo(kill_delay: float) -> None:
    """Crash a real worker mid-tool-call and watch the run recover (no services)."""
    from harness.demo import run_demo

    sys.exit(run_demo(kill_delay))


COMMANDS = [migrate, serve, demo]
