"""URLs as a user is shown them: a password masked, a relative SQLite path
made absolute (harness.settings says what the store and broker are)."""

from __future__ import annotations

import re
from pathlib import Path

#: The password of a URL's user (``scheme://user:password@host``), up to the
#: host's last ``@``, and a ``password=`` query parameter (libpq takes one).
_PASSWORD = re.compile(r"(?<=://)([^/@:?#]*):[^/?#]*@")
_PASSWORD_PARAM = re.compile(r"(?<=[?&])(password=)[^&#]*", re.IGNORECASE)
#: An SQLite URL whose path is relative (three slashes, not four): to the working folder.
_RELATIVE_SQLITE = re.compile(r"(sqlite(?:\+\w+)?:///)(?!/)([^?]+)(.*)", re.DOTALL)


def shown_url(url: str) -> str:
    """``url`` as it may be printed or logged: its password masked (``***``,
    as SQLAlchemy's ``hide_password`` does)."""
    return _PASSWORD_PARAM.sub(r"\1***", _PASSWORD.sub(r"\1:***@", url))


def absolute_sqlite(url: str) -> str:
    """An SQLite URL with a relative path made absolute: the default
    ``sqlite:///harness.db`` is a file of the working folder, and a user who
    starts a run in one folder and a worker in another must see two paths."""
    found = _RELATIVE_SQLITE.fullmatch(url)
    if found is None or found.group(2) == ":memory:" or found.group(2).startswith("file:"):
        return url
    scheme, path, rest = found.groups()
    return f"{scheme}{Path(path).absolute()}{rest}"
