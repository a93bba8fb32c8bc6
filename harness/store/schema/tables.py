"""The run store's tables, declared once with SQLAlchemy Core: the columns
every statement, every migration (tests/contract/test_schema_drift.py) and
the memory store's rows (harness.store.memory.rows) follow.

Cost model (principle 8): a run's row holds its cursor, status, version and
lease; steps are rows keyed by (run_id, idx); so a checkpoint touches a fixed
number of rows whatever the run's length, and loading a run for recovery is
one SELECT joining the run to the step at its cursor.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ColumnElement,
    Computed,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
    func,
    literal,
)

from harness.records import RunStatus

metadata = MetaData()

#: ``harness_runs.wake_minute``, as the database computes it (migration 0019
#: holds the same text). round() is in SQLite and PostgreSQL alike, and what
#: matters of it is that it never decreases: a run past its ``wake_at`` has a
#: ``wake_minute`` no later than :func:`minute_of` the sweep's time, so the
#: sweeper may look for it by that index and miss nothing.
WAKE_MINUTE = "CASE WHEN status IN ('pending', 'running', 'waiting') THEN round(wake_at / 60.0) END"

runs = Table(
    "harness_runs",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("agent", String(200), nullable=False),
    Column("goal", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("cursor", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("step_count", Integer, nullable=False),
    Column("owner", String(200)),
    Column("lease_expires_at", Float),
    # When the next step message should have been processed; the sweeper
    # re-dispatches a movable, unleased run once this time has passed.
    Column("wake_at", Float),
    Column("result", Text),
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # Sweeper re-sends since the run last moved (migration 0004).
    Column("resends", Integer, nullable=False, server_default="0"),
    # Why no worker could carry the run, recorded once (migration 0004).
    Column("blocked", Text),
    # Provider-reported tokens and their price, summed by each model step's
    # result checkpoint (migration 0005).
    Column("input_tokens", Integer, nullable=False, server_default="0"),
    Column("output_tokens", Integer, nullable=False, server_default="0"),
    Column("cost_usd", Float, nullable=False, server_default="0"),
    # Budgets raised by an operator for this run, and a pause asked for: both
    # written without moving the version, so a step in flight still records
    # its result (migration 0006).
    Column("max_tokens", Integer),
    Column("max_cost_usd", Float),
    Column("pause_requested", Boolean, nullable=False, server_default=false()),
    # The run a fork copied its first steps from, and the model step it
    # continued at; null for a run that is not a fork (migration 0007).
    Column("forked_from_run", String(128)),
    Column("forked_from_step", Integer),
    # The recorded run a replay is served from, and whether a call that
    # diverges from it may still be made when its tool is read_only (0008).
    Column("replay_of_run", String(128)),
    Column("replay_live_reads", Boolean, nullable=False, server_default=false()),
    # A child run's parent and the step whose call started it; never changed
    # after insert (migration 0014).
    Column("parent_run", String(128)),
    Column("parent_step", Integer),
    # The first step deferred since the run's last model turn: the next one
    # waits until every deferred step from here has its answer (0014).
    Column("deferred_from", Integer),
    # A user's message waits for the run's next model turn since then; set
    # beside the version by `harness send`, cleared once none waits (0015).
    Column("inbox_at", Float),
    # The step limit, raised by `harness resume --max-steps` (None: the agent's).
    Column("max_steps", Integer),
    # A nonce made fresh whenever this store inserts the row (a new run, a
    # fork, a replay, a child, an import), never exported, never changed: it
    # tells a worker's memory of a run (harness.engine.transcripts) from
    # another run under the same id. NULL on rows made before it (0017).
    Column("incarnation", String(32)),
    # The minute of ``wake_at`` while the sweeper may have to act on the run
    # (pending, running, waiting), NULL otherwise: the database computes it, so
    # no writer can forget it (0019). See ix_harness_runs_wake_minute. Stored:
    # PostgreSQL indexes no virtual column (SQLite, which adds none stored to
    # a table that has rows, holds it virtual).
    Column("wake_minute", Float, Computed(WAKE_MINUTE, persisted=True)),
)

# On status alone: an index on a column every checkpoint changes (wake_at)
# would rule out heap-only updates and make each lookup slower as a run ages.
Index("ix_harness_runs_status", runs.c.status)

# The listing's keyset (newest first); neither column ever changes, so
# checkpoints stay heap-only updates (migration 0004).
Index("ix_harness_runs_created", runs.c.created_at, runs.c.run_id)

# A fork's children (`harness list --forked-from`) and prune's ancestry walk;
# the column never changes after insert, so checkpoints stay heap-only (0007).
Index("ix_harness_runs_forked_from", runs.c.forked_from_run)

# A recording's replays (`harness list --replay-of`); never changes after insert (0008).
Index("ix_harness_runs_replay_of", runs.c.replay_of_run)

# A run's children (show, cancel); never changes after insert (0014).
Index("ix_harness_runs_parent", runs.c.parent_run)

# Runs with a user's message waiting (the sweeper's look for one left behind
# a completed run): partial, so it holds only those, and ``inbox_at``
# changes only when a message is kept or taken, so checkpoints stay heap-only (0015).
Index(
    "ix_harness_runs_inbox",
    runs.c.inbox_at,
    postgresql_where=runs.c.inbox_at.is_not(None),
    sqlite_where=runs.c.inbox_at.is_not(None),
)

# The sweeper's way to the runs that are due (issue 26): every run whose
# wake-up has come is in it under a minute that has come, and a run that waits
# a day is not read until its minute comes. An index on ``wake_at`` itself
# would change with every checkpoint (each moves the wake-up), ruling out
# heap-only updates (0003); the minute changes once a minute at most, so a
# run that steps keeps its updates heap-only but for one a minute. A run that
# has ended, waits on an operator or is paused is not in it (NULL). Status
# first: a query for one status and a minute uses both columns, and so
# SQLite, which keeps no statistics unless asked, prefers it to the status
# index (which would read every waiting run).
Index(
    "ix_harness_runs_wake_minute",
    runs.c.status,
    runs.c.wake_minute,
    postgresql_where=runs.c.wake_minute.is_not(None),
    sqlite_where=runs.c.wake_minute.is_not(None),
)


def minute_of(now: float) -> ColumnElement[float]:
    """The bound on ``wake_minute`` of runs due at ``now``, computed by the
    database with the same function as the column (:data:`WAKE_MINUTE`)."""
    return func.round(literal(now, Float) / literal(60.0, Float), type_=Float)


steps = Table(
    "harness_steps",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("kind", String(8), nullable=False),
    Column("status", String(32), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("tool", String(200)),
    Column("args", Text, nullable=False),  # JSON
    Column("result", Text),  # JSON
    Column("error", Text),
    Column("started_at", Float),
    Column("finished_at", Float),
    # Transient model failures retried so far (migration 0005).
    Column("retries", Integer, nullable=False, server_default="0"),
    # An operator's approval or rejection of the call, JSON (migration 0006).
    Column("approval", Text),
    # The blob holding the result when it is too large for the row, "sha256:<hex>";
    # ``result`` is NULL then (harness.store.blobs, migration 0009).
    Column("result_blob", String(80)),
    # What a deferred call waits for, JSON (harness.records.Wait, migration 0014).
    Column("wait", Text),
)

events = Table(
    "harness_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(128), nullable=False),
    Column("version", Integer, nullable=False),
    Column("step_index", Integer),
    Column("from_status", String(32)),
    Column("to_status", String(32), nullable=False),
    Column("worker", String(200)),
    Column("at", Float, nullable=False),
    Column("detail", Text),
)

Index("ix_harness_events_run", events.c.run_id, events.c.id)

tool_results = Table(
    "harness_tool_results",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("run_id", String(128), nullable=False),
    Column("step_index", Integer, nullable=False),
    Column("tool", String(200), nullable=False),
    Column("result", Text),  # JSON; NULL when it is in a blob (migration 0009)
    Column("created_at", Float, nullable=False),
    # As harness_steps.result_blob, or SAME_AS_STEP: the result is the step's.
    Column("result_blob", String(80)),
)

# Signals sent to a run (`harness signal`), and answers that came for a step
# before it deferred: kept until a step takes them, each taken once
# (``taken_step``). ``signal_id``: a sender's id, so its retry is not a second
# signal (unique per run; NULLs are distinct). Migration 0014.
signals = Table(
    "harness_signals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(128), nullable=False),
    Column("name", String(200), nullable=False),
    Column("signal_id", String(200)),
    Column("data", Text),  # JSON
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("taken_step", Integer),
    Column("taken_at", Float),
)

Index("ix_harness_signals_run", signals.c.run_id, signals.c.id)
Index("ix_harness_signals_sender_id", signals.c.run_id, signals.c.signal_id, unique=True)

# Durable counters for what leaves no row behind (a rejected stale write).
counters = Table(
    "harness_counters",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Integer, nullable=False),
)

# The sweeper's delivery probes, one row per lane (harness.engine.probes):
# when its last probe was sent, and the newest one a worker took off the lane
# (every message sent before it has been delivered). Migration 0010.
lanes = Table(
    "harness_lanes",
    metadata,
    Column("lane", String(32), primary_key=True),
    Column("probe_sent_at", Float),
    Column("delivered_before", Float),
)

# Every sweep, whoever ran it (beat, `harness sweep`, a worker that took the
# sweep over): the age of the last one, and which worker swept when. The
# newest rows only, and the newest of each kind (record_sweep prunes). 0012.
sweeps = Table(
    "harness_sweeps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),
    Column("worker", String(200), nullable=False),
    # The time the sweep judged runs by (its start), and its end.
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=False),
    Column("redispatched", Integer, nullable=False),
)

# The lease of the one worker that sweeps while beat does not (harness.celery.
# takeover): a row taken by compare-and-set, renewed each sweep. 0012.
sweep_lease = Table(
    "harness_sweep_lease",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("holder", String(200)),
    Column("expires_at", Float),
)

# Results too large for their rows (harness.store.blobs), each owned by one
# run: a prune deletes a run's blobs on the primary key's prefix, a fork or an
# import writes blobs of its own (migration 0009).
blobs = Table(
    "harness_blobs",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("digest", String(80), primary_key=True),  # "sha256:<hex>" of the text
    Column("size", Integer, nullable=False),  # bytes
    Column("data", Text),  # the JSON text; NULL: a file in HARNESS_BLOB_DIR
)

# The agent catalog (harness.catalog): one row per agent each worker carries,
# written when the worker starts and refreshed while it lives (``last_seen``);
# a clean stop deletes its rows, a dead worker's stop being refreshed. Not a
# run's: no run refers to it, and an export leaves it out (migration 0013).
agents = Table(
    "harness_agents",
    metadata,
    Column("worker", String(200), primary_key=True),  # the Celery node name
    Column("agent", String(200), primary_key=True),
    Column("definition_hash", String(80), nullable=False),  # "sha256:<hex>"
    Column("tools", Text, nullable=False),  # JSON: [{"name", "effect", "requires_approval"}]
    Column("started_at", Float, nullable=False),  # the worker's first publish
    Column("last_seen", Float, nullable=False),
)

# The pieces of model answers as they are written, for the API's event stream
# where there is no Redis (harness.streams): a view while a step runs, not part
# of the record (an export leaves it out); trimmed HARNESS_STREAM_TTL after it
# was written. ``entry``: JSON [step, attempt, kind, text]. Migration 0016.
stream = Table(
    "harness_stream",
    metadata,
    # 64 bits on PostgreSQL (a busy fleet writes many a second); on SQLite an
    # INTEGER PRIMARY KEY with AUTOINCREMENT, so a trim that empties the table
    # never hands a reader's ids out again.
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("run_id", String(128), nullable=False),
    Column("entry", Text, nullable=False),
    Column("at", Float, nullable=False),
    sqlite_autoincrement=True,
)

Index("ix_harness_stream_run", stream.c.run_id, stream.c.id)
Index("ix_harness_stream_at", stream.c.at)

#: ``result_blob`` of an idempotency record whose result is its step's: the
#: text a tool step's result checkpoint writes to both rows is kept once, in
#: the step's row (a done step's result never changes), and the reads of a
#: record take it from there (schema.upkeep.record_result). Never a digest.
SAME_AS_STEP = "step"

#: Columns that say where a value is stored, not what it is: reads resolve
#: them, and an export leaves them out (harness.store.blobs).
STORAGE_COLUMNS: dict[str, tuple[str, ...]] = {
    steps.name: ("result_blob",),
    tool_results.name: ("result_blob",),
}

#: Columns whose value is this store's own, made fresh as it inserts the row,
#: or computed by the database from the others (``wake_minute``): an export
#: leaves them out, and an import writes new ones (harness.store.mapping).
LOCAL_COLUMNS: dict[str, tuple[str, ...]] = {
    runs.name: ("incarnation", "wake_minute"),
}

#: Text columns that hold JSON: the store decodes them for an export, and
#: encodes them again on import, so a document carries values, not strings.
JSON_COLUMNS: dict[str, tuple[str, ...]] = {
    steps.name: ("args", "result", "approval", "wait"),
    tool_results.name: ("result",),
    signals.name: ("data",),
}

# The tools a run was offered, read from its toolsets (MCP servers) when a
# worker first carried it (harness.engine.offering): JSON {toolset: [tool, ...]},
# first writer wins, never changed. Migration 0017.
run_tools = Table(
    "harness_run_tools",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("tools", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

ALL_TABLES = (
    runs,
    steps,
    events,
    tool_results,
    counters,
    blobs,
    lanes,
    sweeps,
    sweep_lease,
    agents,
    signals,
    stream,
    run_tools,
)

#: The statuses a worker carries a run forward in, as stored.
MOVABLE = tuple(s.value for s in RunStatus if s.movable)

#: The statuses a run never leaves, as stored.
TERMINAL = tuple(s.value for s in RunStatus if s.terminal)
