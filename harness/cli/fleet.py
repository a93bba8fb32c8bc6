"""The commands about the workers and recovery rather than one run: stats,
agents, sweep, health.
"""

from __future__ import annotations

import sys

import click

from harness import api, compose
from harness.cli.support import EXIT_ERROR, Seconds, emit, friendly, store_health
from harness.engine import recovery
from harness.reads import Reads
from harness.store import SweepKind


@click.command()
@click.option("--json", "as_json", is_flag=True)
@friendly
def stats(as_json: bool) -> None:
    """Recovery metrics: steps found RUNNING, stale writes, takeovers, in-doubt, stuck steps."""
    reads = api.reads()
    data = reads.stats()
    if as_json:
        emit(data)
        return
    for name, value in data.items():
        click.echo(f"{name:32} {value}")
    _warn_about_sweeps(reads)


def _warn_about_sweeps(reads: Reads) -> None:
    """Say so under ``harness stats`` when no one sweeps, or a worker does in beat's place."""
    from harness.celery import health as checks

    interval = reads.sweep_interval
    now = reads.clock.now()
    found = checks.check_sweeps(reads.store, interval, checks.sweeps_max_age(interval), now)
    if not found.healthy or found.kind == SweepKind.WORKER.value:
        click.echo(f"sweeps: {found.line}", err=True)


@click.command()
@click.option("--json", "as_json", is_flag=True)
@friendly
def agents(as_json: bool) -> None:
    """The agents live workers carry: their tools, definition and workers."""
    from harness.catalog import describe

    listed = api.list_agents()
    if as_json:
        emit([entry.to_dict() for entry in listed])
        return
    for line in describe(listed, api.runtime().clock.now()):
        click.echo(line)


@click.command()
@click.option("--json", "as_json", is_flag=True)
@friendly
def sweep(as_json: bool) -> None:
    """Re-dispatch runs whose lease expired or whose message was lost (once)."""
    # No probe: this process's broker may not be the workers' (beat probes).
    sent = recovery.sweep(api.runtime(), probe=False)
    if as_json:
        emit([{"run_id": s.run_id, "cursor": s.cursor, "reason": s.reason} for s in sent])
        return
    for s in sent:
        click.echo(f"re-dispatched {s.run_id} at step {s.cursor}: {s.reason}")
    click.echo(f"{len(sent)} run(s) re-dispatched")


@click.command()
@click.option("--worker", is_flag=True, help="Check this machine's worker heartbeat file.")
@click.option("--sweeps", is_flag=True, help="Check that the store records sweeps.")
@click.option(
    "--max-age",
    type=Seconds(),
    help="Seconds a heartbeat (default 30) or a sweep (default 4 sweep intervals) stays fresh.",
)
@click.option("--json", "as_json", is_flag=True)
@friendly
def health(worker: bool, sweeps: bool, max_age: float | None, as_json: bool) -> None:
    """Exit 0 if healthy, 1 if not: the run store, or with --worker the
    worker, or with --sweeps recovery.

    Alone: the run store (HARNESS_DATABASE_URL) answers and its schema is
    current; nothing is changed. --worker, liveness for a supervisor: the
    worker refreshes HARNESS_WORKER_HEARTBEAT_FILE from its consumer loop; a
    stale or missing file means a wedged, stopped or disconnected worker (one
    that found no usable store does not start). --sweeps, recovery: the store
    recorded a sweep lately (by beat, or by a worker that took the sweep over
    because beat does not sweep).
    """
    from harness.celery import health as checks

    if worker and sweeps:
        raise click.UsageError("one check at a time: --worker or --sweeps")
    if not (worker or sweeps):
        if not store_health(as_json):
            sys.exit(EXIT_ERROR)
        return
    settings = compose.settings()
    result: checks.Health | checks.SweepHealth
    if worker:
        limit = checks.DEFAULT_MAX_AGE if max_age is None else max_age
        result = checks.check(settings.worker_heartbeat_file, limit)
    else:
        reads = api.reads()
        limit = checks.sweeps_max_age(settings.sweep_interval) if max_age is None else max_age
        now = reads.clock.now()
        result = checks.check_sweeps(reads.store, settings.sweep_interval, limit, now)
    emit(result.to_dict()) if as_json else click.echo(result.line)
    if not result.healthy:
        sys.exit(EXIT_ERROR)


COMMANDS = [stats, agents, sweep, health]
