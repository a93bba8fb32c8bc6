"""What a tool returns to wait on the world instead of holding a worker:
:class:`Deferred` (an answer that comes later: a callback, a completion, a
signal, a child run's end) and :class:`Sleep` (a wake-up after so long).

A tool returns one after starting whatever will answer (it holds
``ctx.idempotency_key`` to pass downstream, and ``ctx.callback_url()`` to
be called back on). The step becomes ``deferred``, the worker slot is free
at once, and the run's next model turn waits until the answer is in. What
the tool returned is recorded under the step's idempotency key like any
result (as the :func:`marker` below), so a crash between the call and the
checkpoint replays the same wait instead of calling the tool again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.errors import BadInput
from harness.inputs import storable_text
from harness.records import JSON, Wait, WaitKind

#: The longest a deferred call or a sleep may wait: a year.
MAX_WAIT = 366 * 24 * 3600.0

#: The longest signal name (the column's width).
MAX_NAME = 200

#: The key of a recorded wait in a tool's stored result.
MARKER = "__harness_wait__"


def seconds(value: object, what: str) -> float:
    """A number of seconds to wait: more than 0, at most :data:`MAX_WAIT`."""
    return _seconds(value, what, allow_zero=False)


def _seconds(value: object, what: str, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(what, f"must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    low_ok = seconds >= 0 if allow_zero else seconds > 0
    if not math.isfinite(seconds) or not low_ok or seconds > MAX_WAIT:
        bound = "0" if allow_zero else "more than 0"
        raise BadInput(what, f"must be {bound} and at most {MAX_WAIT:.0f} seconds, not {value!r}")
    return seconds


def signal_name(name: object, what: str = "signal") -> str:
    """A signal's name as stored: 1 to MAX_NAME printable characters."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise BadInput(what, f"must be a name of 1 to {MAX_NAME} characters")
    if not name.isprintable() or storable_text(name) != name:
        raise BadInput(what, "must be printable text")
    if name.startswith("@"):  # "@step:N" keeps a step's own early answer (harness.engine.waits)
        raise BadInput(what, "may not start with '@': such names are the harness's own")
    return name


@dataclass(frozen=True)
class Deferred:
    """Returned by a tool: its answer comes later. ``timeout``: after that
    many seconds without one, the step's result is an error the model sees
    ("no answer within N s"); None waits as long as it takes (a child run).
    ``signal``: the name of the signal that answers it (`harness signal`),
    besides the completions every deferred step takes."""

    timeout: float | None = None
    signal: str | None = None
    #: The child run whose end answers it (``ctx.start_child``): set by the harness.
    child: str | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None:
            object.__setattr__(self, "timeout", _seconds(self.timeout, "timeout", allow_zero=False))
        if self.signal is not None:
            signal_name(self.signal)


@dataclass(frozen=True)
class Sleep:
    """Returned by a tool: wake the step after ``seconds`` with ``{"slept":
    seconds}``. The wake-up is in the store, so no worker holds it."""

    seconds: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", _seconds(self.seconds, "seconds", allow_zero=True))


def marker(returned: Deferred | Sleep) -> dict[str, JSON]:
    """The JSON recorded for a wait a tool returned."""
    if isinstance(returned, Sleep):
        return {MARKER: {"kind": WaitKind.SLEEP.value, "timeout": returned.seconds}}
    kind = WaitKind.CALLBACK
    if returned.child is not None:
        kind = WaitKind.CHILD
    elif returned.signal is not None:
        kind = WaitKind.SIGNAL
    word: dict[str, JSON] = {"kind": kind.value, "timeout": returned.timeout}
    if returned.signal is not None:
        word["signal"] = returned.signal
    if returned.child is not None:
        word["child"] = returned.child
    return {MARKER: word}


def refuse_marker(value: JSON, field: str) -> JSON:
    """``value``, unless it is shaped as a recorded wait: a tool's plain
    result, an answer or a signal's data may not pass for one (a step that
    obeyed it would wait on whatever it names)."""
    if isinstance(value, dict) and MARKER in value:
        raise BadInput(field, f"an object with the key {MARKER!r} is reserved for the harness")
    return value


def wait_of(result: JSON, now: float) -> Wait | None:
    """The wait a recorded tool result holds, its deadline counted from
    ``now``; None for a result that is not a wait."""
    if not isinstance(result, dict) or set(result) != {MARKER}:
        return None
    word = result[MARKER]
    if not isinstance(word, dict):
        return None
    found = Wait.from_json({**word, "until": None})
    if found is None:
        return None
    until = None if found.timeout is None else now + found.timeout
    return Wait(found.kind, until, found.timeout, found.signal, found.child)


def slept(wait: Wait) -> dict[str, JSON]:
    """A sleep's result: the seconds it was asked to sleep."""
    seconds = wait.timeout or 0.0
    return {"slept": int(seconds) if seconds.is_integer() else seconds}


def timed_out(wait: Wait) -> str:
    """The error a deferred call's timeout gives the model."""
    seconds = wait.timeout or 0.0
    shown = f"{int(seconds)}" if seconds.is_integer() else f"{seconds:g}"
    return f"no answer within {shown} s (waited for {wait.describe()})"
