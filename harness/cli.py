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
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import api, clisupport, compose
from harness.clisupport import EXIT_ERROR, INDEX, Seconds, json_option, where
from harness.engine import recovery
from harness.engine.operations import Acted
from harness.inputs import render_json
from harness.reads import MAX_PAGE, Reads, RunQuery, abandoned
from harness.records import JSON, RunStatus, StepStatus
from harness.replay.report import BatchReport, Outcome
from harness.store import SweepKind

console = Console()

EXIT_NOT_FINISHED = 2


_friendly = clisupport.friendly


def _emit(data: JSON) -> None:
    click.echo(render_json(data, indent=2, sort_keys=True))


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3]
    except (OverflowError, ValueError, OSError):  # no time of day: shown as it is
        return str(ts)


@click.group()
def main() -> None:
    """Durable LLM agent runs on Celery."""


@main.command()
@click.argument("agent")
@click.argument("goal")
@click.option(
    "--run-id", help="Explicit id; the same again is a no-op, with another goal an error."
)
@click.option("--json", "as_json", is_flag=True)
@_friendly
def start(agent: str, goal: str, run_id: str | None, as_json: bool) -> None:
    """Start a run of AGENT towards GOAL and dispatch its first step."""
    started = api.start(agent, goal, run_id=run_id)
    _emit({"run_id": started.run_id}) if as_json else click.echo(started.run_id)
    if not started.created:  # stdout stays the id
        said = f"run {started.run_id} existed with this agent and goal: nothing started"
        click.echo(said, err=True)


@main.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def show(run_id: str, as_json: bool) -> None:
    """Show a run and its steps."""
    shown = api.reads().run_detail(run_id)
    run, steps = shown.run, shown.steps
    if as_json:
        _emit(shown.to_dict())
        return
    console.print(
        f"[bold]{run.run_id}[/]  agent={run.agent}  status=[bold]{run.status}[/]  "
        f"cursor={run.cursor}  version={run.version}  owner={run.owner or '-'}"
    )
    # What users and models wrote is shown as text, never read as markup.
    console.print(f"goal: {escape(run.goal)}")
    if run.forked_from is not None:
        console.print(f"forked from {run.forked_from.run_id} at step {run.forked_from.step}")
    if run.replay_of is not None:
        live = " (read_only calls off the recording made live)" * run.replay_of.live_read_only
        console.print(f"replay of {run.replay_of.run_id}{live}")
    if run.result:
        console.print(f"result: {escape(run.result)}")
    if run.error:
        console.print(f"[red]error: {escape(run.error)}[/]")
    if run.pause_requested and run.status is not RunStatus.PAUSED:
        console.print("[yellow]pause requested: it stops at its next step boundary[/]")
    if shown.attention is not None:
        console.print(
            f"[yellow]attention ({shown.attention.code}): {escape(shown.attention.detail)}[/]"
        )
    if run.input_tokens or run.output_tokens:
        console.print(
            f"usage: {run.input_tokens} in / {run.output_tokens} out tokens"
            f"  cost: ${run.cost_usd:.6f}"
        )
    table = Table("index", "kind", "tool", "status", "attempts", "result / error")
    for s in steps:
        detail = s.error if s.error else ("" if s.result is None else json.dumps(s.result))
        if not detail and s.kind == "tool":  # not made yet: what it will be called with
            detail = f"args: {json.dumps(s.args)}"
        if s.approval is not None:
            detail = f"({clisupport.word(s.approval.to_json())}) {detail}"
        attempts = f"{s.attempts} (+{s.retries} retried)" if s.retries else str(s.attempts)
        # Left running in a run that has ended: it will never finish.
        status = "abandoned" if abandoned(s, run) else s.status
        table.add_row(str(s.index), s.kind, s.tool or "", status, attempts, escape(detail[:80]))
    console.print(table)


@main.command("list")
@click.option("--status", type=click.Choice([s.value for s in RunStatus]))
@click.option("--agent", help="Only runs of this agent.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, MAX_PAGE))
@click.option("--cursor", help="The next page, from the previous page's 'next page' line.")
@click.option("--forked-from", metavar="RUN", help="Only the forks of RUN.")
@click.option("--replay-of", metavar="RUN", help="Only the replays of RUN.")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def list_runs(
    status: str | None,
    agent: str | None,
    limit: int,
    cursor: str | None,
    forked_from: str | None,
    replay_of: str | None,
    as_json: bool,
) -> None:
    """List recent runs, newest first, a page at a time."""
    query = RunQuery(
        status=None if status is None else RunStatus(status),
        agent=agent,
        limit=limit,
        cursor=cursor,
        forked_from=forked_from,
        replay_of=replay_of,
    )
    reads = api.reads()
    page = reads.list_runs(query)
    more = None if page.next_cursor is None else f"next page: --cursor {page.next_cursor}"
    listed = [reads.listed(r) for r in page.runs]
    if as_json:
        _emit(listed)
        if more:  # stdout stays the JSON list
            click.echo(more, err=True)
        return
    table = Table("run_id", "agent", "status", "cursor", "version", "updated", "attention")
    for r, row in zip(page.runs, listed, strict=True):
        table.add_row(
            r.run_id,
            r.agent,
            r.status,
            str(r.cursor),
            str(r.version),
            _when(r.updated_at),
            str(row["attention"] or ""),
        )
    console.print(table)
    if more:
        click.echo(more)


@main.command()
@click.argument("run_id")
@click.option("--after", "after_id", type=INDEX, help="Only the events after this event id.")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def history(run_id: str, after_id: int | None, as_json: bool) -> None:
    """The run's flight recorder: every transition with its version."""
    events = list(api.reads().all_history(run_id, after_id))
    if as_json:
        _emit([e.to_dict() for e in events])
        return
    table = Table("time", "version", "step", "from", "to", "worker", "detail")
    for e in events:
        table.add_row(
            _when(e.at),
            str(e.version),
            "" if e.step_index is None else str(e.step_index),
            e.from_status or "",
            e.to_status,
            escape(e.worker or ""),
            escape(e.detail or ""),
        )
    console.print(table)


@main.command()
@click.argument("run_id")
@click.option("--timeout", default=60.0, show_default=True, type=Seconds(), help="Seconds to wait.")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def wait(run_id: str, timeout: float, as_json: bool) -> None:
    """Wait until a run finishes or needs an operator. Exit 2 on timeout."""
    run = api.wait_for(run_id, timeout)
    if as_json:
        _emit(run.to_dict())
    else:
        click.echo(f"{run.run_id} {run.status}" + (f": {run.error}" if run.error else ""))
    if not (run.status.terminal or run.status.held):
        if run.status is RunStatus.PENDING:
            click.echo(
                f"{run.run_id} is still pending after {timeout:g}s: no worker took its "
                f"first step; is one running on the same store and broker? {where()}",
                err=True,
            )
        sys.exit(EXIT_NOT_FINISHED)


@main.command()
@click.argument("run_id")
@click.option("--reason", default="cancelled by operator", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@_friendly
def cancel(run_id: str, reason: str, as_json: bool) -> None:
    """Cancel a run; a step executing now will not have its result recorded."""
    _say(api.Operator().cancel(run_id, reason), as_json)


def _say(done: Acted, as_json: bool, line: str | None = None) -> None:
    """An operator action's answer: the run, and ``line`` if it changed it,
    or what the run already had (a repeat: "already ...")."""
    run = done.run
    if as_json:
        _emit({**run.to_dict(), "changed": done.changed})
    elif not done.changed:
        click.echo(f"{run.run_id} {run.status}: {done.said}")
    else:
        click.echo(line or f"{run.run_id} {run.status}")


def _awaited(run_id: str, step: int | None) -> int | None:
    """The call an approval is for: the one named, or the one the run waits on."""
    if step is not None:
        return step
    current = api.get_run(run_id).current
    if current is not None and current.status is StepStatus.AWAITING_APPROVAL:
        return current.index
    return None


def _say_word(done: Acted, step: int | None, as_json: bool) -> None:
    """The run after an approve or reject, and the word now on the call: whose,
    and when (the first word stands)."""
    run = done.run
    if as_json or not done.changed:
        _say(done, as_json)
        return
    chosen = [s for s in api.get_steps(run.run_id) if s.index == step]
    word = chosen[0].approval if chosen else None
    said = "" if word is None else f": step {step} {clisupport.word(word.to_json(), at=_when)}"
    click.echo(f"{run.run_id} {run.status}{said}")


@main.command()
@click.argument("run_id")
@click.option("--step", type=INDEX, help="A later call of the batch (default: the one awaited).")
@click.option("--args", "args_json", metavar="JSON", help="Call it with these arguments instead.")
@click.option("--by", help="Who approves, for the flight recorder (default: your user name).")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def approve(
    run_id: str, step: int | None, args_json: str | None, by: str | None, as_json: bool
) -> None:
    """Approve a call that requires approval; acted on once (a second word is a no-op)."""
    args = None
    if args_json is not None:
        args = json_option(args_json, "--args")
        if not isinstance(args, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--args")
    target = _awaited(run_id, step)
    _say_word(api.Operator(by).approve(run_id, step, args), target, as_json)


@main.command()
@click.argument("run_id")
@click.option("--reason", required=True, help="Why: the model is told.")
@click.option("--step", type=INDEX, help="A later call of the batch (default: the one awaited).")
@click.option("--by", help="Who rejects, for the flight recorder (default: your user name).")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def reject(run_id: str, reason: str, step: int | None, by: str | None, as_json: bool) -> None:
    """Reject a call that requires approval: it is not made, the model is told why."""
    target = _awaited(run_id, step)
    _say_word(api.Operator(by).reject(run_id, reason, step), target, as_json)


@main.command()
@click.argument("run_id")
@click.option("--by", help="Who pauses, for the flight recorder (default: your user name).")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def pause(run_id: str, by: str | None, as_json: bool) -> None:
    """Pause a run: a step in flight finishes, no further step starts until resumed."""
    done = api.Operator(by).pause(run_id)
    run = done.run
    if run.status is RunStatus.PAUSED:
        _say(done, as_json, f"{run.run_id} paused")
    else:
        _say(done, as_json, f"{run.run_id} {run.status}: pauses at its next step boundary")


@main.command()
@click.argument("run_id")
@click.option("--max-tokens", type=click.IntRange(1), help="Raise the run's token budget.")
@click.option(
    "--max-cost-usd", type=click.FloatRange(0, min_open=True), help="Raise its cost budget."
)
@click.option("--by", help="Who resumes, for the flight recorder (default: your user name).")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def resume(
    run_id: str, max_tokens: int | None, max_cost_usd: float | None, by: str | None, as_json: bool
) -> None:
    """Resume a paused run, with its budgets raised if given."""
    _say(api.Operator(by).resume(run_id, max_tokens, max_cost_usd), as_json)


@main.command()
@click.argument("run_id")
@click.option("--retry", is_flag=True, help="Call the tool again.")
@click.option("--succeeded", "result", metavar="JSON", help="It happened; JSON is its result.")
@click.option("--fail", is_flag=True, help="Treat the call as failed.")
@click.option("--force", is_flag=True, help="Retry before the step time limit has passed.")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def resolve(
    run_id: str, retry: bool, result: str | None, fail: bool, force: bool, as_json: bool
) -> None:
    """Settle a run's in-doubt at_most_once step, and set the run moving again."""
    if retry + fail + (result is not None) != 1:
        raise click.UsageError("give exactly one of --retry, --succeeded JSON, --fail")
    value: JSON = None
    if result is not None:
        value = json_option(result, "--succeeded")
    decision = "retry" if retry else "fail" if fail else "succeeded"
    done = api.Operator().resolve(run_id, decision, value, force=force)
    _say(done, as_json, f"{done.run.run_id} {done.run.status} ({decision})")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@_friendly
def stats(as_json: bool) -> None:
    """Recovery metrics: steps found RUNNING, stale writes, takeovers, in-doubt, stuck steps."""
    reads = api.reads()
    data = reads.stats()
    if as_json:
        _emit(data)
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


@main.command()
@click.option("--json", "as_json", is_flag=True)
@_friendly
def agents(as_json: bool) -> None:
    """The agents live workers carry: their tools, definition and workers."""
    from harness.catalog import describe

    listed = api.list_agents()
    if as_json:
        _emit([entry.to_dict() for entry in listed])
        return
    for line in describe(listed, api.runtime().clock.now()):
        click.echo(line)


@main.command()
@click.option("--json", "as_json", is_flag=True)
@_friendly
def sweep(as_json: bool) -> None:
    """Re-dispatch runs whose lease expired or whose message was lost (once)."""
    # No probe: this process's broker may not be the workers' (beat probes).
    sent = recovery.sweep(api.runtime(), probe=False)
    if as_json:
        _emit([{"run_id": s.run_id, "cursor": s.cursor, "reason": s.reason} for s in sent])
        return
    for s in sent:
        click.echo(f"re-dispatched {s.run_id} at step {s.cursor}: {s.reason}")
    click.echo(f"{len(sent)} run(s) re-dispatched")


@main.command()
@_friendly
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


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@_friendly
def serve(host: str, port: int) -> None:
    """Serve the HTTP API and the run dashboard (token: HARNESS_API_TOKEN)."""
    from harness.web import server

    server.serve(compose.settings(), host, port, announce=click.echo)


@main.command()
@click.option(
    "--kill-delay", default=0.0, type=Seconds(), help="Extra seconds to wait before the SIGKILL."
)
@_friendly
def demo(kill_delay: float) -> None:
    """Crash a real worker mid-tool-call and watch the run recover (no services)."""
    from harness.demo import run_demo

    sys.exit(run_demo(kill_delay))


@main.command()
@click.option("--worker", is_flag=True, help="Check this machine's worker heartbeat file.")
@click.option("--sweeps", is_flag=True, help="Check that the store records sweeps.")
@click.option(
    "--max-age",
    type=Seconds(),
    help="Seconds a heartbeat (default 30) or a sweep (default 4 sweep intervals) stays fresh.",
)
@click.option("--json", "as_json", is_flag=True)
@_friendly
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
        if not clisupport.store_health(as_json):
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
    _emit(result.to_dict()) if as_json else click.echo(result.line)
    if not result.healthy:
        sys.exit(EXIT_ERROR)


@main.command()
@click.option("--older-than", "age", required=True, metavar="AGE", help="30d, 12h, 90m, 3600s.")
@click.option(
    "--status", help="Only finished runs of this status (completed, failed, cancelled, diverged)."
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--batch-size", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@_friendly
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
        _emit(report.to_dict())
        return
    for line in retention.describe(report):
        click.echo(line)


@main.command()
@click.argument("run_id")
@click.option("--at", "at", required=True, type=INDEX, help="A model step's index.")
@click.option("--goal", help="Continue towards this goal instead of the original one.")
@click.option("--agent", help="Continue under this registered agent instead.")
@click.option("--run-id", "new_run_id", help="Explicit id; forking to it twice is a no-op.")
@click.option("--json", "as_json", is_flag=True)
@_friendly
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
    _emit({"run_id": forked}) if as_json else click.echo(forked)


@main.command("export")
@click.argument("run_id")
@click.option(
    "--output", "-o", metavar="FILE", type=click.Path(), help="Write to FILE (whole or not at all)."
)
@click.option("--compact", is_flag=True, help="No indentation: a smaller file, the same hash.")
@_friendly
def export_run(run_id: str, output: str | None, compact: bool) -> None:
    """Write RUN with its steps, history and tool records as one JSON document
    (format: docs/EXPORT.md), to stdout or FILE."""
    from harness.runs import archive

    document = api.export_run(run_id)
    if output is None:
        sys.stdout.buffer.write(archive.dumps(document, compact))
    else:
        archive.save(document, output, compact)


@main.command("import")
@click.argument("file", metavar="FILE", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@_friendly
def import_run(file: str, as_json: bool) -> None:
    """Import a run written by `harness export` (FILE, or - for stdin); importing
    it again is a no-op. A malformed or tampered document writes nothing."""
    from harness.runs import archive

    source = sys.stdin.buffer.read() if file == "-" else archive.read_source(file)
    result = api.import_run(source)
    _emit(result.to_dict()) if as_json else click.echo(result.line)


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


@main.command()
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
@_friendly
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
    if batch == (run_id is not None):
        raise click.UsageError("give RUN_ID, or --batch to replay many runs (not both)")
    chosen = {
        "--from-agent": from_agent is not None,
        "--since": since is not None,
        "--status": ctx.get_parameter_source("status") is not click.core.ParameterSource.DEFAULT,
        "--limit": ctx.get_parameter_source("limit") is not click.core.ParameterSource.DEFAULT,
    }
    if not batch and any(chosen.values()):
        options = ", ".join(name for name, given in chosen.items() if given)
        raise click.UsageError(f"{options}: only with --batch (they choose its runs)")
    if batch and new_run_id is not None:
        raise click.UsageError("--run-id names one replay: not with --batch")
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
        summary = BatchReport(agent, reports)
        if as_json:
            _emit(summary.to_dict())
        else:
            _print_batch(summary)
    elif as_json:
        _emit(reports[0].to_dict())
    else:
        for line in reports[0].lines():
            click.echo(line)
    waiting = False
    for r in reports:
        if r.outcome == Outcome.HELD:
            waiting = True
            click.echo(
                f"replay {r.replay.run_id} is {r.replay.status}: `harness resume` or "
                "`harness cancel` it",
                err=True,
            )
        elif r.outcome == Outcome.UNFINISHED:
            waiting = True
            click.echo(
                f"replay {r.replay.run_id} not ended within {timeout:g}s: is a worker "
                f"running on the same store and broker? {where()}",
                err=True,
            )
    if waiting:
        sys.exit(EXIT_NOT_FINISHED)
    if strict and any(r.outcome != Outcome.MATCHED for r in reports):
        sys.exit(EXIT_DIVERGED)


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
