"""The commands about one run or many: start, show, list, history, wait.

All but ``start`` are reads: they go through the read service (harness.reads)
and import no agent code.
"""

from __future__ import annotations

import json
import sys

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
    when,
    where,
    word,
)
from harness.reads import MAX_PAGE, RunDetail, RunQuery, abandoned, waits_for
from harness.records import RunStatus


@click.command()
@click.argument("agent")
@click.argument("goal")
@click.option(
    "--run-id", help="Explicit id; the same again is a no-op, with another goal an error."
)
@click.option("--json", "as_json", is_flag=True)
@friendly
def start(agent: str, goal: str, run_id: str | None, as_json: bool) -> None:
    """Start a run of AGENT towards GOAL and dispatch its first step."""
    started = api.start(agent, goal, run_id=run_id)
    emit({"run_id": started.run_id}) if as_json else click.echo(started.run_id)
    if not started.created:  # stdout stays the id
        said = f"run {started.run_id} existed with this agent and goal: nothing started"
        click.echo(said, err=True)


@click.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@friendly
def show(run_id: str, as_json: bool) -> None:
    """Show a run and its steps."""
    shown = api.reads().run_detail(run_id)
    run, steps = shown.run, shown.steps
    if as_json:
        emit(shown.to_dict())
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
    _family(shown)
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
        if s.kind == "user":  # the user's message
            detail = f"said: {s.args.get('text', '')}"
        if s.approval is not None:
            detail = f"({word(s.approval.to_json())}) {detail}"
        waiting = waits_for(s)
        if waiting is not None:
            detail = f"waits for {waiting}"
        attempts = f"{s.attempts} (+{s.retries} retried)" if s.retries else str(s.attempts)
        # Left running in a run that has ended: it will never finish.
        status = "abandoned" if abandoned(s, run) else s.status
        table.add_row(str(s.index), s.kind, s.tool or "", status, attempts, escape(detail[:80]))
    console.print(table)


def _family(shown: RunDetail) -> None:
    """The run's parent and children (``harness.agent_tool``), and what its
    deferred calls wait for, one line each."""
    run = shown.run
    if run.parent is not None:
        console.print(f"child of {run.parent.run_id} (its step {run.parent.step})")
    for child in shown.children:
        at = "" if child.parent is None else f" (step {child.parent.step})"
        console.print(f"child {child.run_id}{at}: {child.status}")
    for step in shown.steps:
        waiting = waits_for(step)
        if waiting is not None:
            console.print(f"[cyan]step {step.index} waits for {escape(waiting)}[/]")


@click.command("list")
@click.option("--status", type=click.Choice([s.value for s in RunStatus]))
@click.option("--agent", help="Only runs of this agent.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, MAX_PAGE))
@click.option("--cursor", help="The next page, from the previous page's 'next page' line.")
@click.option("--forked-from", metavar="RUN", help="Only the forks of RUN.")
@click.option("--replay-of", metavar="RUN", help="Only the replays of RUN.")
@click.option("--json", "as_json", is_flag=True)
@friendly
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
        emit(listed)
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
            when(r.updated_at),
            str(row["attention"] or ""),
        )
    console.print(table)
    if more:
        click.echo(more)


@click.command()
@click.argument("run_id")
@click.option("--after", "after_id", type=INDEX, help="Only the events after this event id.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def history(run_id: str, after_id: int | None, as_json: bool) -> None:
    """The run's flight recorder: every transition with its version."""
    events = list(api.reads().all_history(run_id, after_id))
    if as_json:
        emit([e.to_dict() for e in events])
        return
    table = Table("time", "version", "step", "from", "to", "worker", "detail")
    for e in events:
        table.add_row(
            when(e.at),
            str(e.version),
            "" if e.step_index is None else str(e.step_index),
            e.from_status or "",
            e.to_status,
            escape(e.worker or ""),
            escape(e.detail or ""),
        )
    console.print(table)


@click.command()
@click.argument("run_id")
@click.option("--timeout", default=60.0, show_default=True, type=Seconds(), help="Seconds to wait.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def wait(run_id: str, timeout: float, as_json: bool) -> None:
    """Wait until a run finishes or needs an operator. Exit 2 on timeout."""
    run = api.wait_for(run_id, timeout)
    if as_json:
        emit({**run.to_dict(), "result": api.reads().result(run)})
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


COMMANDS = [start, show, list_runs, history, wait]
