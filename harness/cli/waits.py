"""Answers to runs that wait on the world, from the command line: complete a
deferred call, send a signal (harness.engine.waits decides; these print what
it answered: one line, or ``--json``), and send a user's next message
(harness.engine.conversation).
"""

from __future__ import annotations

import click

from harness import api
from harness.cli.support import INDEX, emit, friendly, json_option
from harness.engine.waits import Delivered
from harness.records import JSON


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


COMMANDS = [complete, signal, send]
