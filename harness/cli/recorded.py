"""The commands over whole recorded runs: fork, replay, export, import, prune."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import click
from rich.markup import escape
from rich.table import Table

from harness import api
from harness.cli.support import (
    EXIT_NOT_FINISHED,
    INDEX,
    Seconds,
    console,
    emit,
    friendly,
    where,
)
from harness.records import RunStatus
from harness.replay.report import BatchReport, ReplayReport, ReplayVerdict


@click.command()
@click.option("--older-than", "age", required=True, metavar="AGE", help="30d, 12h, 90m, 3600s.")
@click.option(
    "--status", help="Only finished runs of this status (completed, failed, cancelled, diverged)."
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--batch-size", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@friendly
def prune(age: str, status: str | None, dry_run: bool, batch_size: int, as_json: bool) -> None:
    """Delete finished runs last updated more than AGE ago, with their steps,
    events and tool records, in short batches; fork ancestors of kept runs stay."""
    from harness.runs import prune as retention

    rt = api.runtime()
    report = retention.prune(
        rt.store,
        retention.parse_age(age),
        rt.clock.now(),
        status,
        dry_run=dry_run,
        batch_size=batch_size,
    )
    if as_json:
        emit(report.to_dict())
        return
    for line in retention.describe(report):
        click.echo(line)


@click.command()
@click.argument("run_id")
@click.option("--at", "at", required=True, type=INDEX, help="A model step's index.")
@click.option("--goal", help="Continue towards this goal instead of the original one.")
@click.option("--agent", help="Continue under this registered agent instead.")
@click.option("--run-id", "new_run_id", help="Explicit id; forking to it twice is a no-op.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def fork(
    run_id: str,
    at: int,
    goal: str | None,
    agent: str | None,
    new_run_id: str | None,
    as_json: bool,
) -> None:
    """A new run that reuses RUN's recorded steps before model step --at (copied,
    never executed again) and continues live from it; RUN is untouched."""
    forked = api.fork_run(run_id, at, goal=goal, agent=agent, new_run_id=new_run_id)
    emit({"run_id": forked}) if as_json else click.echo(forked)


@click.command("export")
@click.argument("run_id")
@click.option(
    "--output", "-o", metavar="FILE", type=click.Path(), help="Write to FILE (whole or not at all)."
)
@click.option("--compact", is_flag=True, help="No indentation: a smaller file, the same hash.")
@friendly
def export_run(run_id: str, output: str | None, compact: bool) -> None:
    """Write RUN with its steps, history and tool records as one JSON document
    (format: docs/EXPORT.md), to stdout or FILE."""
    from harness.runs import archive

    document = api.export_run(run_id)
    if output is None:
        sys.stdout.buffer.write(archive.dumps(document, compact))
    else:
        archive.save(document, output, compact)


@click.command("import")
@click.argument("file", metavar="FILE", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@friendly
def import_run(file: str, as_json: bool) -> None:
    """Import a run written by `harness export` (FILE, or - for stdin); importing
    it again is a no-op. A malformed or tampered document writes nothing."""
    from harness.runs import archive

    source = sys.stdin.buffer.read() if file == "-" else archive.read_source(file)
    result = api.import_run(source)
    emit(result.to_dict()) if as_json else click.echo(result.line)


#: ``harness replay --strict``: a replay left its recording.
EXIT_DIVERGED = 3
#: What a batch may choose its runs by (a run ends diverged only as a replay,
#: and a batch never replays a replay).
_RECORDED = [s.value for s in RunStatus if s.terminal and s is not RunStatus.DIVERGED]


def _since(text: str | None) -> float | None:
    """``--since``: an ISO 8601 date or time, UTC unless it says otherwise."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a date: give one as 2026-12-01 or 2026-12-01T08:00Z",
            param_hint="--since",
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


@click.command()
@click.argument("run_id", required=False)
@click.option("--agent", required=True, help="Replay under this registered agent.")
@click.option(
    "--live-read-only",
    is_flag=True,
    help="Make a call that leaves the recording if its tool is read_only, instead of stopping.",
)
@click.option("--strict", is_flag=True, help=f"Exit {EXIT_DIVERGED} if a replay diverged (CI).")
@click.option("--batch", is_flag=True, help="Replay many recorded runs instead of RUN_ID.")
@click.option("--from-agent", metavar="NAME", help="Batch: runs of this agent (default: any).")
@click.option(
    "--status",
    type=click.Choice(_RECORDED),
    default="completed",
    show_default=True,
    help="Batch: runs that ended so.",
)
@click.option("--since", metavar="DATE", help="Batch: runs created at DATE or later (UTC).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--run-id", "new_run_id", help="The replay's id; replaying to it twice is a no-op.")
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=Seconds(),
    help="Seconds to wait for the end.",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@friendly
def replay(
    ctx: click.Context,
    run_id: str | None,
    agent: str,
    live_read_only: bool,
    strict: bool,
    batch: bool,
    from_agent: str | None,
    status: str,
    since: str | None,
    limit: int,
    new_run_id: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Run RUN_ID again under --agent, its tool calls served from RUN_ID's
    recording (never made again), and report where the replay left it.

    A call off the recording stops the replay (it ends `diverged`), or with
    --live-read-only is made if its tool is read_only; other tools are never
    called. Waits for the replay (workers carry it), then prints the report.
    Exit status: 2 if it has not ended within --timeout or waits for an
    operator (paused), 3 with --strict if it diverged or was cancelled."""
    _refuse_mixed_options(ctx)
    if run_id is not None:
        ids = [api.replay_run(run_id, agent, live_read_only=live_read_only, new_run_id=new_run_id)]
    else:
        ids = api.replay_batch(
            agent,
            from_agent=from_agent,
            status=RunStatus(status),
            since=_since(since),
            limit=limit,
            live_read_only=live_read_only,
        )
    api.wait_all(ids, timeout)
    reports = [api.replay_report(i) for i in ids]
    if batch:
        _print_summary(BatchReport(agent, reports), as_json)
    elif as_json:
        emit(reports[0].to_dict())
    else:
        for line in reports[0].lines():
            click.echo(line)
    _exit_unless_settled(reports, strict, timeout)


def _refuse_mixed_options(ctx: click.Context) -> None:
    """A usage error for options that do not go together: one RUN_ID or
    ``--batch``; the options that choose a batch's runs only with it, and
    ``--run-id`` only without it."""
    given = ctx.params
    batch = given["batch"]
    if batch == (given["run_id"] is not None):
        raise click.UsageError("give RUN_ID, or --batch to replay many runs (not both)")
    chosen = {
        "--from-agent": given["from_agent"] is not None,
        "--since": given["since"] is not None,
        "--status": ctx.get_parameter_source("status") is not click.core.ParameterSource.DEFAULT,
        "--limit": ctx.get_parameter_source("limit") is not click.core.ParameterSource.DEFAULT,
    }
    if not batch and any(chosen.values()):
        options = ", ".join(name for name, on in chosen.items() if on)
        raise click.UsageError(f"{options}: only with --batch (they choose its runs)")
    if batch and given["new_run_id"] is not None:
        raise click.UsageError("--run-id names one replay: not with --batch")


def _exit_unless_settled(reports: list[ReplayReport], strict: bool, timeout: float) -> None:
    """Exit 2 (saying why on stderr) if a replay has not ended or waits for
    an operator; with ``strict``, exit 3 if one did not match its recording."""
    waiting = False
    for r in reports:
        if r.outcome == ReplayVerdict.HELD:
            waiting = True
            click.echo(
                f"replay {r.replay.run_id} is {r.replay.status}: `harness resume` or "
                "`harness cancel` it",
                err=True,
            )
        elif r.outcome == ReplayVerdict.UNFINISHED:
            waiting = True
            click.echo(
                f"replay {r.replay.run_id} not ended within {timeout:g}s: is a worker "
                f"running on the same store and broker? {where()}",
                err=True,
            )
    if waiting:
        sys.exit(EXIT_NOT_FINISHED)
    if strict and any(r.outcome != ReplayVerdict.MATCHED for r in reports):
        sys.exit(EXIT_DIVERGED)


def _print_summary(summary: BatchReport, as_json: bool) -> None:
    if as_json:
        emit(summary.to_dict())
    else:
        _print_batch(summary)


def _print_batch(summary: BatchReport) -> None:
    table = Table("recording", "replay", "outcome", "step", "at", "tokens", "cost")
    for r in summary.reports:
        d = r.divergence
        delta = r.delta
        table.add_row(
            r.recording.run_id[:12],
            r.replay.run_id[:12],
            r.outcome,
            "" if d is None else str(d.step),
            "" if d is None else escape(d.replayed_tool or d.kind),
            f"{delta['input_tokens']:+d}/{delta['output_tokens']:+d}",
            f"{delta['cost_usd']:+.6f}",
        )
    console.print(table)
    for line in summary.summary():
        click.echo(line)


COMMANDS = [prune, fork, export_run, import_run, replay]
