"""Input at every door: what the store's columns hold, and how outside values are made to fit.

Values reach the store from outside through a handful of doors: a run's goal
and an operator's words (the CLI, the HTTP API, Python), a tool's result or
error, a model's answer and tool-call arguments, an imported archive. Two
kinds of column receive them, and each has one rule here:

* **Text columns** (goal, result, error, reason, detail, tool and agent
  names, worker) cannot hold every Python string: PostgreSQL refuses NUL
  (U+0000) in ``text``, and a lone surrogate (U+D800-U+DFFF unpaired) is not
  UTF-8, so neither SQLite nor a JSON answer can carry it. Text that the
  harness produced or must keep whatever it is (a tool's error, a model's
  final answer) is made storable by :func:`storable_text`: each NUL and each
  lone surrogate becomes U+FFFD, the replacement character, and nothing else
  changes. Text an operator types is refused instead (:func:`checked_text`),
  so a typo is answered, not silently altered.
* **JSON columns** (a step's arguments, result and approval, a tool record)
  hold a JSON value: :func:`checked_json` takes what ``json.dumps`` writes
  (a tuple as a list, a number key as its text) and refuses what JSON
  cannot say (NaN, infinities, objects of other types), nesting
  deeper than :data:`MAX_DEPTH` (a value that deep breaks readers: pydantic
  stops at about 250 levels, Python's ``json`` near 1,000) and integers of
  more than :data:`MAX_INT_DIGITS` digits (Python refuses to print them),
  and replaces lone surrogates in strings as above. A NUL inside a JSON
  string is kept: JSON escapes it, so every column holds it.

The store applies :func:`storable_text` to every text column (:func:`storable`)
and :func:`json_text` to every JSON column it writes (harness.store.sql), so no
checkpoint can fail on what it carries; the doors call :func:`checked_text`
and :func:`checked_json` first, so a bad value is refused with
:class:`~harness.errors.BadInput` naming the field, or, for a tool's result
and a model's arguments, turned into an error result the model sees.
Reads never fail on a stored value either: :func:`render_json` writes any
value a reader may meet (stored before these rules, or imported) as JSON.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from harness.errors import BadInput

#: The deepest nesting of lists and objects accepted at a door.
MAX_DEPTH = 64
#: The most digits an integer in a JSON value may have (Python prints at most 4,300).
MAX_INT_DIGITS = 1000
#: What replaces NUL and lone surrogates in stored text.
REPLACEMENT = "\ufffd"
#: The longest goal an operator may send, in characters (over HTTP the body
#: limit, HARNESS_API_MAX_BODY, may bound it first).
MAX_GOAL = 1 << 20
#: The longest short text an operator may send (a reason, a name, a path).
MAX_SHORT_TEXT = 10_000

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_INT = 10**MAX_INT_DIGITS


def storable_text(text: str) -> str:
    """``text`` with each NUL and each lone surrogate replaced by U+FFFD.

    A valid surrogate pair cannot occur in a Python ``str`` built from UTF-8
    (it decodes to one code point), so every surrogate found is a lone one."""
    if text.isascii():
        return text if "\x00" not in text else text.replace("\x00", REPLACEMENT)
    return _UNSTORABLE.sub(REPLACEMENT, text)


def storable_or_none(text: str | None) -> str | None:
    """:func:`storable_text` of ``text``, None kept."""
    return None if text is None else storable_text(text)


def storable(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with each text value made storable (:func:`storable_text`): the
    store applies it to every row it writes, JSON columns encoded first by
    :func:`json_text`, so no checkpoint fails, and is retried, on what it carries."""
    return {c: storable_text(v) if type(v) is str else v for c, v in row.items()}


def checked_text(text: str, field: str, limit: int = MAX_SHORT_TEXT) -> str:
    """``text`` as an operator sent it, if a column can hold it unchanged;
    otherwise :class:`BadInput` naming ``field``: a NUL, a lone surrogate,
    or more than ``limit`` characters."""
    if not isinstance(text, str):
        raise BadInput(field, f"must be text, not {type(text).__name__}")
    if len(text) > limit:
        raise BadInput(field, f"is {len(text):,} characters long; at most {limit:,}")
    found = _UNSTORABLE.search(text)
    if found is not None:
        what = "a NUL character" if found.group() == "\x00" else "a lone surrogate"
        raise BadInput(field, f"contains {what} (at {found.start()}), which no column can hold")
    return text


def checked_json(value: Any, field: str, max_depth: int = MAX_DEPTH) -> Any:
    """``value`` as a JSON value every column and reader can hold, or
    :class:`BadInput` naming ``field`` and where in it the problem is.

    Returns the value itself when nothing needed replacing (the usual case),
    else a copy whose strings have their lone surrogates replaced."""
    fixed = _checked(value, field, "", max_depth)
    return value if fixed is _SAME else fixed


_SAME: Any = object()
_PLAIN: tuple[Any, ...] = (bool, int, float, str, dict, list)


def _checked(value: Any, field: str, path: str, depth: int) -> Any:
    """The value's replacement, or :data:`_SAME` if it needs none."""
    if value is None or value is True or value is False:
        return _SAME
    kind = type(value)
    if kind is str:
        if value.isascii() or _SURROGATE.search(value) is None:
            return _SAME  # a NUL is kept: JSON escapes it
        return _SURROGATE.sub(REPLACEMENT, value)
    if kind is int:
        if -_MAX_INT < value < _MAX_INT:
            return _SAME
        raise BadInput(field, f"{_at(path)}an integer of more than {MAX_INT_DIGITS} digits")
    if kind is float:
        if math.isfinite(value):
            return _SAME
        raise BadInput(field, f"{_at(path)}{value!r} is not a JSON number")
    if kind is dict or kind is list:
        if depth <= 0:
            raise BadInput(field, f"{_at(path)}nested deeper than {MAX_DEPTH} levels")
        return _container(value, field, path, depth - 1)
    if isinstance(value, tuple):  # a list to JSON, as json.dumps writes it
        if depth <= 0:
            raise BadInput(field, f"{_at(path)}nested deeper than {MAX_DEPTH} levels")
        fixed = _container(list(value), field, path, depth - 1)
        return list(value) if fixed is _SAME else fixed
    for base in _PLAIN:  # a subclass (an IntEnum, a str Enum): checked as a plain copy
        if isinstance(value, base):
            plain: Any = base(value)
            fixed = _checked(plain, field, path, depth)
            return plain if fixed is _SAME else fixed
    raise BadInput(field, f"{_at(path)}a {kind.__name__} is not a JSON value")


def _container(value: dict[Any, Any] | list[Any], field: str, path: str, depth: int) -> Any:
    if isinstance(value, list):
        items = [_checked(v, field, f"{path}[{i}]", depth) for i, v in enumerate(value)]
        if all(item is _SAME for item in items):
            return _SAME
        return [v if item is _SAME else item for v, item in zip(value, items, strict=True)]
    changed = False
    out: dict[str, Any] = {}
    for key, item in value.items():
        text = key if type(key) is str else _key(key, field, path)
        name = text if text.isascii() else _SURROGATE.sub(REPLACEMENT, text)
        fixed = _checked(item, field, f"{path}.{name}" if path else name, depth)
        changed = changed or fixed is not _SAME or name != key
        out[name] = item if fixed is _SAME else fixed
    return out if changed else _SAME


def _key(key: Any, field: str, path: str) -> str:
    """A key that is not text, as json.dumps writes it (``1`` -> ``"1"``,
    ``True`` -> ``"true"``); keys JSON has no text for are refused."""
    if isinstance(key, str):
        return str.__str__(key)
    if (
        key is None
        or isinstance(key, bool | int)
        or (isinstance(key, float) and math.isfinite(key))
    ):
        if isinstance(key, int) and not isinstance(key, bool) and not -_MAX_INT < key < _MAX_INT:
            raise BadInput(field, f"{_at(path)}a key of more than {MAX_INT_DIGITS} digits")
        text: str = json.dumps(key)
        return text
    raise BadInput(field, f"{_at(path)}the key {key!r} is not text")


def _at(path: str) -> str:
    """Where in a value, on one line: a key's control characters and lone
    surrogates are written as escapes (``\\n``, ``\\ud800``)."""
    if len(path) > 80:
        path = "…" + path[-79:]
    if not path.isprintable():
        path = "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)
    return f"at {path}: " if path else ""


def json_text(value: Any, field: str) -> str:
    """``value`` as the text of a JSON column. A value the doors let through
    is written as ``json.dumps`` writes it; a lone surrogate is replaced
    (see :func:`checked_json`); what JSON cannot say is :class:`BadInput`."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as err:
        checked_json(value, field, max_depth=1 << 30)  # names the part at fault
        raise BadInput(field, f"is not JSON: {err}") from None
    # Lone surrogates survive json.dumps as \ud8xx escapes; a valid pair is
    # also escaped so, and only then is it worth a walk.
    if "\\ud" in text:
        fixed = checked_json(value, field, max_depth=1 << 30)
        if fixed is not value:
            text = json.dumps(fixed, allow_nan=False)
    return text


def render_json(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """``value`` as JSON text, whatever it holds: never raises. For readers
    (``show --json``, the API, an export) of values stored before these
    rules or written by hand: NaN and infinities become null, lone
    surrogates U+FFFD, nesting too deep for ``json`` (about 1,000 levels) is
    cut at :data:`MAX_DEPTH` with the text ``"<nested deeper than 64
    levels>"``, other objects become their ``str``."""
    options: dict[str, Any] = {"ensure_ascii": False, "indent": indent, "sort_keys": sort_keys}
    try:
        text = json.dumps(value, allow_nan=False, **options)
        text.encode()  # a lone surrogate fails here
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return json.dumps(readable(value), **options)
    return text


def readable(value: Any, depth: int = MAX_DEPTH) -> Any:
    """A copy of ``value`` that :func:`render_json` can always write (its rules)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):  # too many digits for str(): said, not printed
        return (
            value if -_MAX_INT < value < _MAX_INT else f"<an integer of {value.bit_length()} bits>"
        )
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict | list | tuple):
        if depth <= 0:
            return f"<nested deeper than {MAX_DEPTH} levels>"
        if isinstance(value, dict):
            return {storable_text(str(k)): readable(v, depth - 1) for k, v in value.items()}
        return [readable(v, depth - 1) for v in value]
    return storable_text(str(value))
