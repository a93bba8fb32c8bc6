"""The access log never keeps a login token, whatever spelling carried it.

FastAPI reads a query parameter by its percent-decoded name, so
``?%74oken=...`` logs in as ``?token=...`` does: the log is redacted by
parsing the query the same way, not by matching one spelling.
"""

from __future__ import annotations

import logging

import pytest

from harness.web.server import RedactTokens, redacted

SECRET = "s3cret-Token_value"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (f"/login?token={SECRET}", "/login?token=<redacted>"),
        (f"/login?%74oken={SECRET}", "/login?%74oken=<redacted>"),
        (f"/login?%74%6F%6B%65%6E={SECRET}", "/login?%74%6F%6B%65%6E=<redacted>"),
        (f"/login?tok%65n={SECRET}&next=/", "/login?tok%65n=<redacted>&next=/"),
        (f"/login?a=1&TOKEN={SECRET}", "/login?a=1&TOKEN=<redacted>"),
        (f"/login?token={SECRET}&token={SECRET}", "/login?token=<redacted>&token=<redacted>"),
        ("/api/runs?agent=token&limit=2", "/api/runs?agent=token&limit=2"),
        ("/api/runs?tokens=2", "/api/runs?tokens=2"),
        ("/api/runs", "/api/runs"),
    ],
)
def test_every_spelling_of_the_token_parameter_is_redacted(target: str, expected: str) -> None:
    assert redacted(target) == expected


def test_the_filter_redacts_uvicorns_access_line() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/login?%74oken={SECRET}", "1.1", 303),
        None,
    )
    assert RedactTokens().filter(record)
    line = record.getMessage()
    assert SECRET not in line and "/login?%74oken=<redacted>" in line
