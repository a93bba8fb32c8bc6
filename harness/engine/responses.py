"""A model step's response recorded by the model itself, the moment it arrives.

A provider model's response is recorded around its whole call
(:meth:`~harness.engine.executor.StepExecutor.respond`). A model that does
more with a response than return it (a Pydantic AI agent validates it, runs
its output functions, checks the next tool's arguments) sets
``records_early`` and gets a :class:`StepRecorder` on its request instead:
it records the response with its usage and price before its own code runs,
so that code that outlasts the step, is killed, or raises never buys the
response again, and a response paid for is charged even if the run fails
on it (harness.engine.billing reads the same record).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.engine.leases import Lease
from harness.models import Usage
from harness.records import JSON, Step

if TYPE_CHECKING:
    from harness.engine.runtime import Runtime


class StepRecorder:
    """The :class:`~harness.models.ResponseRecorder` of one model step.
    ``kept``: the result recorded by this attempt (or read back), if any."""

    def __init__(self, rt: Runtime, step: Step, namespace: str, lease: Lease, model: str) -> None:
        self.rt, self.step, self.namespace, self.lease, self.model = (
            rt,
            step,
            namespace,
            lease,
            model,
        )
        self.kept: JSON = None

    def recorded(self) -> tuple[bool, JSON]:
        found, stored = self.rt.executor.recorded_response(self.step, self.namespace, self.lease)
        if found:
            self.kept = stored
        return found, stored

    def keep(self, result: dict[str, JSON], usage: Usage | None) -> JSON:
        priced = dict(result)
        if usage is not None:
            priced["usage"] = usage.to_dict()
            cost = self.rt.prices.cost(self.model, usage)
            if cost is not None:
                priced["cost_usd"] = cost
        self.kept = self.rt.executor.keep_response(self.step, self.namespace, self.lease, priced)
        return self.kept

    def release(self) -> None:
        self.rt.executor.release_response(self.step, self.namespace, self.lease)

    def usage(self) -> Usage | None:
        """The usage of the recorded response, if one is."""
        raw = self.kept.get("usage") if isinstance(self.kept, dict) else None
        return Usage.from_dict(raw) if isinstance(raw, dict) else None
