"""The ``harness`` command line. Every read command takes ``--json``.

It is the composition root of a command: the settings come from
harness.compose, once. Each command imports what only it needs (the web
server, the migration tool, the archive, the worker's health files) in its
own body, so that ``harness --help`` and ``harness show`` load neither
Celery nor the web stack nor Alembic.

Errors are one line on stderr and a non-zero exit status, never a traceback.
Read commands (``show``, ``list``, ``history``, ``stats``, ``wait``,
``agents``) go
through the read service (harness.reads) and import no agent code; ``start``
and ``resolve --fail`` import ``HARNESS_IMPORTS``, from the working directory
first, as ``celery -A`` does.

The commands live by what they are about: :mod:`~harness.cli.runs` (start,
show, list, history, wait), :mod:`~harness.cli.operator` (cancel, approve,
reject, pause, resume, resolve), :mod:`~harness.cli.waits` (complete, signal, send, follow:
answers to runs that wait on the world), :mod:`~harness.cli.recorded` (fork, replay,
export, import, prune), :mod:`~harness.cli.fleet` (stats, agents, sweep,
health) and :mod:`~harness.cli.admin` (migrate, serve, demo); what they share
is in :mod:`~harness.cli.support`.
"""

from __future__ import annotations

import click

from harness.cli import admin, fleet, operator, recorded, runs, waits
from harness.cli.recorded import EXIT_DIVERGED
from harness.cli.support import EXIT_ERROR, EXIT_NOT_FINISHED

__all__ = ["EXIT_DIVERGED", "EXIT_ERROR", "EXIT_NOT_FINISHED", "main"]


@click.group()
def main() -> None:
    """Durable LLM agent runs on Celery."""


for _module in (runs, operator, waits, recorded, fleet, admin):
    for _command in _module.COMMANDS:
        main.add_command(_command)
