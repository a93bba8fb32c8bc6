"""The Celery layer's package, harness.celery, and the old paths kept for configurations.

``harness/celery/`` is named like the library it wraps: inside it, ``import
celery`` must still mean Celery (absolute imports). And the dotted paths that
configurations written before the move hold (beat's scheduler, the broker
transports, ``celery_settings``, ``instrument``) must still name the very same
objects, so that an ``isinstance`` or an identity check cannot tell them apart.
"""

from __future__ import annotations

import celery
import pytest
from celery.utils.imports import symbol_by_name

import harness.celery
from harness.celery import config, fsbroker, redisbroker, sweeper, tracing
from harness.settings import Settings


def test_inside_the_package_celery_is_the_library() -> None:
    """The step task's base and the app type come from Celery itself."""
    assert harness.celery.Celery is celery.Celery
    assert issubclass(harness.celery.StepTask, celery.Task)
    assert celery.__file__ is not None and "harness" not in celery.__file__


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("harness.worker.sweeper:Scheduler", sweeper.Scheduler),
        ("harness.worker.sweeper:InProcessSweep", sweeper.InProcessSweep),
        ("harness.worker.fsbroker:Transport", fsbroker.Transport),
        ("harness.worker.redisbroker:Transport", redisbroker.Transport),
        ("harness.worker.celeryconf:celery_settings", config.celery_settings),
        ("harness.worker.tracing:instrument", tracing.instrument),
    ],
)
def test_an_old_dotted_path_names_the_same_object(old: str, new: object) -> None:
    """Resolved as Celery resolves a configured scheduler or transport."""
    assert symbol_by_name(old) is new


@pytest.mark.parametrize(
    ("broker", "transport"),
    [("filesystem://", fsbroker.Transport), ("redis://127.0.0.1:1/0", redisbroker.Transport)],
)
def test_the_configuration_names_the_new_paths(broker: str, transport: type) -> None:
    """The scheduler and the transport celery_settings writes are the new
    package's (the old paths are for configurations, not for new output)."""
    conf = config.celery_settings(Settings.from_env({"HARNESS_BROKER_URL": broker}))
    for key, wanted in (("beat_scheduler", sweeper.Scheduler), ("broker_transport", transport)):
        assert conf[key].startswith("harness.celery."), conf[key]
        assert symbol_by_name(conf[key]) is wanted
