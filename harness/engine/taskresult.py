"""What one step task did: the value the Celery task returns (Flower shows
it), and the runner's answer to itself about what to send next."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from harness.agents import Agent
from harness.engine.hints import ClaimHint


class TaskResult(StrEnum):
    """What one step task did; the Celery task returns its value for Flower to show."""

    ADVANCED = "advanced"
    COMPLETED = "completed"
    FAILED = "failed"
    WAITING = "waiting"
    NO_RUN = "no_run"
    NO_AGENT = "no_agent"  # no agent of that name here: left for a worker that has it
    NOT_MOVABLE = "not_movable"
    STALE = "stale"
    LEASED = "leased"
    RACED = "raced"
    LEASE_LOST = "lease_lost"  # taken over (a stall outlived the lease) mid-step
    CANCELLED = "cancelled"  # cancelled by an operator mid-step
    DIVERGED = "diverged"  # a replay's call left its recording: the replay stops
    BUSY = "busy"  # another executor holds the step's key: backed off
    DUPLICATE = "duplicate"  # a second copy of a step under way elsewhere: dropped
    PAUSED = "paused"  # held at a step boundary: asked for, or a budget spent
    RESCHEDULED = "rescheduled"  # waits for a provider (a retry, a rate limit)
    EARLY = "early"  # a message for a rescheduled step, before its time: dropped
    HOP = "hop"  # throughput mode: the next step needs a task of its own
    PROBE = "probe"  # the sweeper's delivery probe (harness.engine.probes): noted


class Stepped(NamedTuple):
    """What one step of the runner did, and what the message it sends next carries."""

    outcome: TaskResult
    agent: Agent | None = None
    next_cursor: int = -1  # set when ADVANCED or RESCHEDULED
    delay: float = 0.0  # set when RESCHEDULED
    hint: ClaimHint | None = None  # may be set when ADVANCED
