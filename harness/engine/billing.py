"""Charging a model call that returned after its run ended.

A model step's usage is summed into its run by the step's result checkpoint.
A cancel (or another worker ending the run while a zombie's call was under
way) fences that checkpoint off, yet the call was paid for: its response is
recorded under the step's key the moment it arrives (with its usage and
price). It is charged here instead, by whichever comes first of

* the worker whose checkpoint was fenced off, with the response in hand, and
* the cancel, which finds the response recorded if the call returned first
  (a worker killed before its checkpoint leaves it there), and a worker
  that fails the run over its limits with such a response at its cursor.

Both go through :meth:`~harness.store.Store.add_late_usage`, which writes
only while the run has ended and the step has no result: the first writer
puts the response on the step and adds its usage to the run, in one
transaction; any other (the second of the two, a retry after a lost
connection, a zombie whose call was read back by a taker-over) matches no
row. A run that goes on is never charged here: whoever carries its step on
reads the recorded response back and charges it in its own checkpoint.

Not charged (RELIABILITY.md): when a taker-over found no recorded response
and called the model too while the zombie's call was still under way, two
calls were paid for and the first recorded is charged, once; and a response
recorded after a cancel by a worker killed before it could charge it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from harness import observability
from harness.errors import StoreError
from harness.models import Usage
from harness.records import JSON, Run, StepKind

if TYPE_CHECKING:
    from harness.engine.runtime import Runtime

log = logging.getLogger(__name__)


def bill_after_end(rt: Runtime, run_id: str, index: int, result: JSON, model: str | None) -> bool:
    """Charge the response ``result`` of model step ``index`` to its ended run,
    if nothing has yet. ``model``: its name, to count it in this process's
    metrics (None: not counted here). False if not charged now: the run goes
    on, the response was charged already, or the store failed (logged)."""
    raw = result.get("usage") if isinstance(result, dict) else None
    if not isinstance(raw, dict):
        return False
    usage = Usage.from_dict(raw)
    cost = recorded_cost(result)
    detail = (
        f"the call under way when the run ended returned: {usage.input_tokens} in / "
        f"{usage.output_tokens} out tokens"
        + ("" if cost is None else f", ${cost:.6f}")
        + (" (estimated)" if usage.estimated else "")
    )
    try:
        billed = rt.store.add_late_usage(
            run_id,
            index,
            result,
            usage.input_tokens,
            usage.output_tokens,
            cost or 0.0,
            rt.worker_id,
            rt.clock.now(),
            detail,
        )
    except StoreError as err:
        log.warning("run=%s step=%d usage of a late call not charged: %s", run_id, index, err)
        return False
    if billed:
        log.info("run=%s step=%d %s", run_id, index, detail)
        if model is not None:
            observability.model_usage(model, usage, cost)
    return billed


def recorded_cost(result: JSON) -> float | None:
    """The price a model step's stored response carries, if any."""
    cost = result.get("cost_usd") if isinstance(result, dict) else None
    return float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None


def bill_recorded(rt: Runtime, run: Run) -> bool:
    """After ``run`` ended: charge the model step at its cursor if its call
    returned (its response is recorded) but its result was never checkpointed."""
    step = run.current
    if step is None or step.kind is not StepKind.MODEL or step.result is not None:
        return False
    try:
        found, recorded = rt.store.get_tool_result(step.idempotency_key)
    except StoreError as err:
        log.warning("run=%s step=%d recorded response not read: %s", run.run_id, step.index, err)
        return False
    return found and bill_after_end(rt, run.run_id, step.index, recorded, None)
