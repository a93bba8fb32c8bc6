"""Celery settings of the ``tasks`` app, from the harness's environment variables.

Nothing happens at import. ``tasks`` hands :func:`from_env` to Celery's
``app.add_defaults``, and Celery calls it when the configuration is first read
(a worker, beat or flower starting; the first message sent), so the variables
are read then, once. The mapping itself is the library's
(:func:`harness.celery.config.celery_settings`), so a process without this
app (the CLI, ``harness.start_run``) can send for any settings.
"""

from typing import Any

from harness import compose
from harness.celery.config import celery_settings


def from_env() -> dict[str, Any]:
    """The Celery configuration for the ``HARNESS_*`` variables, as this
    process's composition root read them (once: harness.compose)."""
    return celery_settings(compose.settings())
