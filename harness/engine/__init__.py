"""The engine: the step runner, its transitions, leases, recovery and operator actions.

runner       orchestrates one step: load, claim, execute, record, dispatch
checkpointing the writes after a step executed (result, back-off, rescheduling)
taskresult   what one step task did (the value Flower shows)
creation     creating a run: the one create rule every door goes through
transitions  every checkpoint the harness writes, one pure function each
steps        executing one step: a model turn or a tool call, to an outcome
leases       one owner per run, renewed by a heartbeat
idempotency  the tool executor: calls through a Redis claim over a durable SQL record
recovery     the sweeper: re-dispatches runs that should be moving
operations   what an operator does: cancel, resolve
"""
