"""Answers to runs that wait on the world, from the command line: complete a
deferred call, send a signal (harness.engine.waits decides; these print what
it answered: one line, or ``--json``), and send a user's next message
(harness.engine.conversation).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from harness import api
from harness.cli.support import EXIT_ERROR, INDEX, emit, friendly, json_option, when
from harness.engine.waits import Delivered
from harness.inputs import render_json
from harness.records import JSON

if TYPE_CHECKING:
    from harness.streams.feed import Event

#: ``harness follow`` stopped by Ctrl-C, as a shell reports SIGINT.
EXIT_INTERRUPTED = 130


def _say(done: Delivered, as_json: bool) -> None:
    """What became of the answer: answered, kept until a step asks, or
    received before (nothing changed, still exit 0, as a repeated approval)."""
    if as_json:
        emit(done.to_dict())
    else:
        click.echo(f"{done.run_id}: {done.said}")


@click.command()
@click.argument("run_id")
@click.option("--step", type=INDEX, help="The deferred call (default: the oldest one).")
@click.option("--result", "result_json", metavar="JSON", help="Its result, as JSON.")
@click.option("--error", metavar="TEXT", help="It failed: the model is told TEXT.")
@click.option("--by", help="Who answers, for the flight recorder (default: your user name).")
@click.option("--json", "as_json", is_flag=True)
@friendly
def complete(
    run_id: str,
    step: int | None,
    result_json: str | None,
    error: str | None,
    by: str | None,
    as_json: bool,
) -> None:
    """Answer a deferred call of RUN with a result or an error; acted on once
    (an answer to a call answered already changes nothing)."""
    if (result_json is None) == (error is None):
        raise click.UsageError("give exactly one of --result JSON, --error TEXT")
    result: JSON = None
    if result_json is not None:
        result = json_option(result_json, "--result")
    _say(api.Operator(by).complete(run_id, step, result=result, error=error), as_json)


@click.command()
@click.argument("run_id")
@click.argument("name")
@click.option("--data", "data_json", metavar="JSON", help="What the signal carries, as JSON.")
@click.option(
    "--id", "signal_id", help="The signal's id: a retry with the same id is received once."
)
@click.option("--json", "as_json", is_flag=True)
@friendly
def signal(
    run_id: str, name: str, data_json: str | None, signal_id: str | None, as_json: bool
) -> None:
    """Send signal NAME to RUN: the oldest call deferred on NAME takes it, or
    it is kept until one asks."""
    data: JSON = None if data_json is None else json_option(data_json, "--data")
    _say(api.Operator().signal(run_id, name, data, signal_id), as_json)


@click.command()
@click.argument("run_id")
@click.argument("text")
@click.option("--id", "message_id", help="The message's id: a retry with it is received once.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def send(run_id: str, text: str, message_id: str | None, as_json: bool) -> None:
    """Give RUN the user's next message TEXT: a completed run goes on with it,
    a moving one gets it at its next model turn; a failed or cancelled run
    refuses it."""
    sent = api.Operator().send(run_id, text, message_id)
    if as_json:
        emit(sent.to_dict())
    else:
        click.echo(f"{sent.run_id}: {sent.said}")


@click.command()
@click.argument("run_id")
@click.option("--after", metavar="ID", help="Resume after this event id (as --json gave it).")
@click.option("--json", "as_json", is_flag=True, help="Each event as one JSON object a line.")
@friendly
def follow(run_id: str, after: str | None, as_json: bool) -> None:
    """Follow RUN until it ends: its answers as they are written, its
    transitions as lines. Exit 0 if it completed, 1 otherwise."""
    status = None
    at_line_start = True
    try:
        for event in api.follow(run_id, after):
            if event.kind is None:
                continue  # a keep-alive
            if as_json:
                click.echo(render_json(event.to_dict()))
            elif event.kind == "token":
                # A lone surrogate a model sent is shown as "?", not a traceback.
                text = str(_field(event, "text")).encode("utf-8", "replace").decode()
                click.echo(text, nl=False)
                at_line_start = text.endswith("\n")
            else:
                line = _line(event)
                click.echo(line if at_line_start else "\n" + line)
                at_line_start = True
            if event.kind == "end":
                status = _field(event, "status")
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    if status != "completed":
        sys.exit(EXIT_ERROR)


def _field(event: Event, name: str) -> JSON:
    data = event.data
    return data.get(name) if isinstance(data, dict) else None


def _line(event: Event) -> str:
    """A transition, a discard or the end as ``harness follow`` prints it."""
    if event.kind == "discard":
        step, attempt = _field(event, "step"), _field(event, "attempt")
        return f"[step {step}: attempt {attempt} will not be recorded; its text is discarded]"
    if event.kind == "end":
        return f"[{_field(event, 'status')}]"
    e = event.data if isinstance(event.data, dict) else {}
    step = "" if e.get("step_index") is None else f" step {e['step_index']}"
    moved = f"{e.get('from') or '-'} -> {e.get('to')}"
    detail = f": {e['detail']}" if e.get("detail") else ""
    return f"[{when(_float(e.get('at')))} v{e.get('version')}{step} {moved}{detail}]"


def _float(value: JSON) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


COMMANDS = [complete, signal, send, follow]
