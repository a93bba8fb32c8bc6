"""The claim hint: what a step message tells the next worker of its run.

Its own module because both ends need it and neither owns it: the runner
makes and reads it, the Celery layer carries it in a message header
(``harness.worker.sending``), and :class:`harness.engine.runtime.Sender`
names it in its signature.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClaimHint:
    """What the worker that moved a run on knows of it, sent with the next
    step's message so that the next worker can claim that step without
    loading the run first: one round trip instead of two. The version it
    committed, the run's agent, and the tool and attempts of the call at the
    new cursor. Only a hint: the claim lands only if the run is still in that
    state (:class:`harness.store.ClaimGuard`); otherwise the run is loaded and
    the message handled as if it had none. Sent in a message header, which a
    worker of an earlier release ignores."""

    version: int
    agent: str
    tool: str
    attempts: int

    #: The message header that carries it.
    HEADER = "harness_claim"

    def header(self) -> list[int | str]:
        return [self.version, self.agent, self.tool, self.attempts]

    @classmethod
    def from_header(cls, value: object) -> ClaimHint | None:
        """The hint in a header's value; None if there is none or it is not one."""
        if not isinstance(value, list | tuple) or len(value) != 4:
            return None
        version, agent, tool, attempts = value
        if not (isinstance(agent, str) and isinstance(tool, str)):
            return None
        if not all(type(n) is int and 0 <= n < _INT_COLUMN for n in (version, attempts)):
            return None  # not a version the store could hold: from no sender of ours
        return cls(version, agent, tool, attempts)


#: The integer columns' bound (PostgreSQL's ``integer``).
_INT_COLUMN = 2**31
