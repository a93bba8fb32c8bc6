"""What the ``harness`` commands share: the door their arguments pass, errors
as one line, which store and broker a command used, and how they print
(JSON for ``--json``, times of day, the rich console).

Every command is wrapped in :func:`friendly`. Before the command runs, each
text argument and option is checked once (:func:`harness.inputs.checked_text`):
an argument that is not UTF-8 (the shell passes bytes; Python decodes the
others to lone surrogates, which no column and no terminal can take) is
refused naming the argument, instead of failing deep in the store. File
paths (``click.Path``) are exempt: any name the file system gives is a path.
Then every :class:`~harness.errors.HarnessError` the command raises becomes
``error: ...`` on stderr and exit status 1. A run that is not found is
perhaps in another store than the one meant (the embedded default is
relative to the working folder): that error names the store and broker the
command used, passwords masked (:func:`where`).
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from rich.console import Console

from harness import compose
from harness.errors import BadInput, HarnessError, RunNotFound
from harness.inputs import MAX_DEPTH, MAX_GOAL, checked_json, checked_text, render_json
from harness.records import JSON

F = TypeVar("F", bound=Callable[..., Any])

console = Console()

EXIT_ERROR = 1
#: ``harness wait`` and ``harness replay``: the run has not ended (or waits for an operator).
EXIT_NOT_FINISHED = 2
#: A step index or event id: a whole number the store's integer columns (BIGINT)
#: can hold. A negative one is left to the command, which says what exists.
INDEX = click.IntRange(-(2**63), 2**63 - 1)
#: The bytes Python's ``surrogateescape`` maps a non-UTF-8 argument's bytes to.
_ESCAPED = range(0xDC80, 0xDD00)


def emit(data: JSON) -> None:
    """Print ``data`` as a read command's ``--json`` answer."""
    click.echo(render_json(data, indent=2, sort_keys=True))


def when(ts: float | None) -> str:
    """A timestamp as the time of day (UTC, milliseconds) for a table."""
    if ts is None:
        return "-"
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3]
    except (OverflowError, ValueError, OSError):  # no time of day: shown as it is
        return str(ts)


def friendly(fn: F) -> F:
    """Check the command's text arguments, then run it; a :class:`HarnessError`
    is one line on stderr and exit status 1 (see the module docstring)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _check_arguments(kwargs)
            return fn(*args, **kwargs)
        except RunNotFound as err:  # perhaps another store than the workers'
            click.echo(f"error: {err} {where()}", err=True)
            sys.exit(EXIT_ERROR)
        except HarnessError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(EXIT_ERROR)

    return wrapper  # type: ignore[return-value]


def _check_arguments(values: Mapping[str, Any]) -> None:
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    for param in ctx.command.params:
        value = values.get(param.name or "")
        if isinstance(value, str) and not isinstance(param.type, click.Path):
            # The shell bounds an argument's length; what matters here is its text.
            checked_argument(value, _field(param))


def checked_argument(text: str, field: str) -> str:
    """``text`` from the command line, if it is text a column can hold;
    :class:`BadInput` naming ``field`` otherwise (not UTF-8, above all)."""
    try:
        return checked_text(text, field, limit=MAX_GOAL)
    except BadInput as err:
        for at, char in enumerate(text):
            if ord(char) in _ESCAPED:
                byte = ord(char) - 0xDC00
                raise BadInput(field, f"is not UTF-8 text (the byte 0x{byte:02x} at {at})") from err
        raise


def _field(param: click.Parameter) -> str:
    """The name a user knows the parameter by: ``GOAL``, ``--reason``."""
    if isinstance(param, click.Option) and param.opts:
        return max(param.opts, key=len)
    return param.human_readable_name


def where() -> str:
    """Which store and broker this command used, for an error about a run that
    is missing or not moving: a command run with other settings than the
    workers' (the embedded default is relative to the working folder) shows it."""
    settings = compose.settings()
    hint = ""
    if settings.store_in_working_folder:
        hint = (
            "; its path is relative to the working folder: give workers and commands "
            "the same absolute HARNESS_DATABASE_URL and HARNESS_HOME"
        )
    return f"(this command used {settings.where}{hint})"


def json_option(text: str, hint: str) -> JSON:
    """The JSON value an option gives (``--args``, ``--succeeded``), as the
    store can hold it: not JSON, or too deep for Python's parser, is a usage
    error; NaN, nesting deeper than the limit, a huge integer a
    :class:`BadInput` naming the option (:func:`harness.inputs.checked_json`)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"not JSON: {err}", param_hint=hint) from None
    except RecursionError:
        raise click.BadParameter(
            f"nested deeper than {MAX_DEPTH} levels", param_hint=hint
        ) from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise click.BadParameter(str(err), param_hint=hint) from None
    return checked_json(value, hint)


class Seconds(click.FloatRange):
    """A duration in seconds: a finite number, 0 or more (``nan`` passes a
    ``FloatRange`` and would make ``wait`` wait for ever)."""

    name = "seconds"

    def __init__(self) -> None:
        super().__init__(min=0)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


def word(approval: Any, *, at: Callable[[float], str] | None = None) -> str:
    """An operator's word on a call, ``approved by alice`` (with the time when
    ``at`` formats it), from whatever the step holds: an imported or older
    record may lack a field, or not be a dict at all."""
    if not isinstance(approval, dict):
        return f"decided: {approval!r}"
    said = str(approval.get("decision") or "decided")
    if approval.get("by"):
        said += f" by {approval['by']}"
    when = approval.get("at")
    if at is not None and isinstance(when, int | float) and not isinstance(when, bool):
        said += f" at {at(when)}"
    return said


def store_health(as_json: bool) -> bool:
    """``harness health``: print whether the run store answers, at the newest
    revision, changing nothing; True if it does."""
    from harness.store.migrate import check_store, shown
    from harness.store.sql import make_engine

    settings = compose.settings()
    store, revision, problem = settings.store_shown, None, None
    try:
        engine = make_engine(settings.database_url)
        store = shown(engine)
        try:
            revision = check_store(engine)
        finally:
            engine.dispose()
    except HarnessError as err:
        problem = str(err)
    if as_json:
        data = {"healthy": problem is None, "store": store, "revision": revision, "error": problem}
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    elif problem is None:
        click.echo(f"healthy: run store {store} at revision {revision}")
    else:
        click.echo(f"unhealthy: {problem}")
    return problem is None
