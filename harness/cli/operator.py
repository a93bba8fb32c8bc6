"""What an operator does to a run from the command line: cancel, approve,
reject, pause, resume, resolve (harness.engine.operations decides; these
print what it answered).
"""

from __future__ import annotations

import click

from harness import api
from harness.cli.support import INDEX, emit, friendly, json_option, when, word
from harness.engine.operations import Acted
from harness.records import JSON, RunStatus, StepStatus


@click.command()
@click.argument("run_id")
@click.option("--reason", default="cancelled by operator", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@friendly
def cancel(run_id: str, reason: str, as_json: bool) -> None:
    """Cancel a run; a step executing now will not have its result recorded."""
    _say(api.Operator().cancel(run_id, reason), as_json)


def _say(done: Acted, as_json: bool, line: str | None = None) -> None:
    """An operator action's answer: the run, and ``line`` if it changed it,
    or what the run already had (a repeat: "already ...")."""
    run = done.run
    if as_json:
        emit({**run.to_dict(), "changed": done.changed})
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
    given = chosen[0].approval if chosen else None
    said = "" if given is None else f": step {step} {word(given.to_json(), at=when)}"
    click.echo(f"{run.run_id} {run.status}{said}")


@click.command()
@click.argument("run_id")
@click.option("--step", type=INDEX, help="A later call of the batch (default: the one awaited).")
@click.option("--args", "args_json", metavar="JSON", help="Call it with these arguments instead.")
@click.option("--by", help="Who approves, for the flight recorder (default: your user name).")
@click.option("--json", "as_json", is_flag=True)
@friendly
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


@click.command()
@click.argument("run_id")
@click.option("--reason", required=True, help="Why: the model is told.")
@click.option("--step", type=INDEX, help="A later call of the batch (default: the one awaited).")
@click.option("--by", help="Who rejects, for the flight recorder (default: your user name).")
@click.option("--json", "as_json", is_flag=True)
@friendly
def reject(run_id: str, reason: str, step: int | None, by: str | None, as_json: bool) -> None:
    """Reject a call that requires approval: it is not made, the model is told why."""
    target = _awaited(run_id, step)
    _say_word(api.Operator(by).reject(run_id, reason, step), target, as_json)


@click.command()
@click.argument("run_id")
@click.option("--by", help="Who pauses, for the flight recorder (default: your user name).")
@click.option("--json", "as_json", is_flag=True)
@friendly
def pause(run_id: str, by: str | None, as_json: bool) -> None:
    """Pause a run: a step in flight finishes, no further step starts until resumed."""
    done = api.Operator(by).pause(run_id)
    run = done.run
    if run.status is RunStatus.PAUSED:
        _say(done, as_json, f"{run.run_id} paused")
    else:
        _say(done, as_json, f"{run.run_id} {run.status}: pauses at its next step boundary")


@click.command()
@click.argument("run_id")
@click.option("--max-tokens", type=click.IntRange(1), help="Raise the run's token budget.")
@click.option(
    "--max-cost-usd", type=click.FloatRange(0, min_open=True), help="Raise its cost budget."
)
@click.option("--max-steps", type=click.IntRange(1), help="Raise its step limit.")
@click.option("--by", help="Who resumes, for the flight recorder (default: your user name).")
@click.option("--json", "as_json", is_flag=True)
@friendly
def resume(
    run_id: str,
    max_tokens: int | None,
    max_cost_usd: float | None,
    max_steps: int | None,
    by: str | None,
    as_json: bool,
) -> None:
    """Resume a paused run, with its budgets (and step limit) raised if given."""
    _say(api.Operator(by).resume(run_id, max_tokens, max_cost_usd, max_steps), as_json)


@click.command()
@click.argument("run_id")
@click.option("--retry", is_flag=True, help="Call the tool again.")
@click.option("--succeeded", "result", metavar="JSON", help="It happened; JSON is its result.")
@click.option("--fail", is_flag=True, help="Treat the call as failed.")
@click.option("--force", is_flag=True, help="Retry before the step time limit has passed.")
@click.option("--json", "as_json", is_flag=True)
@friendly
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


COMMANDS = [cancel, approve, reject, pause, resume, resolve]
