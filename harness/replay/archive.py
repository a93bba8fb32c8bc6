"""Export and import: a run as one versioned JSON document with a content hash.

``harness export RUN`` writes a run with every step, its flight recorder and
its durable idempotency records; ``harness import FILE`` writes them into a
store (another one, or the same one: importing twice is a no-op). The field
by field reference is docs/EXPORT.md; the shape::

    {"format": "harness-run", "schema_version": 1,
     "manifest": {"sha256": HEX, "exported_at": ISO-8601, "harness_version": "0.1.0",
                  "counts": {"steps": N, "events": N, "tool_records": N}},
     "run": {every column of harness_runs},
     "steps": [{every column of harness_steps}, ...],        by idx, 0..N-1
     "events": [{every column of harness_events but id}, ...],   oldest first
     "tool_records": [{every column of harness_tool_results}, ...]}  by step

Rows travel generically, column name to value (JSON columns as values, not
text), so a column a migration adds is exported without a change here. The
models below name every column, and a test holds them equal to the tables:
a new column is then a decision about the format (an optional field, or a new
schema_version), never a silent loss.

The file is pure ASCII (``ensure_ascii``: any other character, a lone
surrogate a tool returned included, is a ``\\uXXXX`` escape), so it always
decodes. The content hash, ``manifest.sha256``: the hex SHA-256 of the ASCII
bytes of ``json.dumps(doc, sort_keys=True, separators=(",", ":"))`` where
``doc`` is the whole document without ``manifest.sha256`` (the other manifest
fields are covered). It is computed on the parsed document, so the file's
indentation and escaping do not matter. It catches truncation, corruption and
hand edits; it is not a signature (anyone can recompute it).

Import checks, in this order, and writes nothing unless every one passes:
the bytes are UTF-8 JSON; the format; the schema_version (a newer one is
refused: this harness cannot know what it added); the content hash; every
field's type, finite times and no unknown field (pydantic, strict); the
counts; step indexes 0..N-1 and the run's step_count; one run id throughout;
tool record keys ``run_id:index`` of existing steps; the run's state (see
:func:`_check_state`: a recomputed hash proves nothing, so these are the
gate against a document that would strand the run); text columns a database
can hold. Then one transaction writes every row
(:meth:`harness.store.Store.import_run`).

The run arrives as it was except for its lease: owner and lease_expires_at
are cleared, since the exporting deployment's workers mean nothing here; a
movable run (pending, running) keeps its wake_at, or gets its updated_at if
it had none, so this store's sweeper carries it on; a terminal run stays
terminal. A run already present with the same content is "already imported";
with other content it is an :class:`ImportConflict`, never an overwrite.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.atomic import write_atomically
from harness.errors import BadArchive, ExportFailed, ImportConflict
from harness.inputs import readable
from harness.records import JSON, RunStatus, StepKind, StepStatus
from harness.store import RunRows, Store, schema

FORMAT = "harness-run"
SCHEMA_VERSION = 1
#: Validation errors named in the one-line message before "and N more".
_SHOWN_ERRORS = 3

RunId = Annotated[str, Field(min_length=1, max_length=128)]
Name = Annotated[str, Field(max_length=200)]
Count = Annotated[int, Field(ge=0)]


class _Strict(BaseModel):
    """Types checked without coercion, unknown fields refused."""

    # No NaN or infinity in a float column: PostgreSQL would take them, and a
    # run "created at NaN" is never due, never prunable.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class Counts(_Strict):
    steps: Count
    events: Count
    tool_records: Count


class Manifest(_Strict):
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    exported_at: str
    harness_version: str
    counts: Counts


class RunDoc(_Strict):
    """Every column of ``harness_runs``."""

    run_id: RunId
    agent: Annotated[str, Field(min_length=1, max_length=200)]
    goal: str
    status: Annotated[RunStatus, Field(strict=False)]  # from its JSON string
    cursor: Count
    version: Count
    step_count: Count
    owner: Name | None
    lease_expires_at: float | None
    wake_at: float | None
    result: str | None
    error: str | None
    created_at: float
    updated_at: float
    resends: Count
    blocked: str | None
    input_tokens: Count
    output_tokens: Count
    cost_usd: Annotated[float, Field(ge=0)]
    max_tokens: Count | None
    max_cost_usd: float | None
    pause_requested: bool
    forked_from_run: RunId | None
    forked_from_step: Count | None
    # Added without a new schema version: a document written before replays
    # existed has neither, and is not a replay.
    replay_of_run: RunId | None = None
    replay_live_reads: bool = False


class StepDoc(_Strict):
    """Every column of ``harness_steps``."""

    run_id: RunId
    idx: Count
    kind: Annotated[StepKind, Field(strict=False)]
    status: Annotated[StepStatus, Field(strict=False)]
    attempts: Count
    tool: Name | None
    args: dict[str, Any]
    result: Any
    error: str | None
    started_at: float | None
    finished_at: float | None
    retries: Count
    approval: dict[str, Any] | None


class EventDoc(_Strict):
    """Every column of ``harness_events`` but ``id``, which the importing store assigns."""

    run_id: RunId
    version: Count
    step_index: Count | None
    from_status: Annotated[str, Field(max_length=32)] | None
    to_status: Annotated[str, Field(max_length=32)]
    worker: Name | None
    at: float
    detail: str | None


class ToolRecordDoc(_Strict):
    """Every column of ``harness_tool_results``."""

    key: Name
    run_id: RunId
    step_index: Count
    tool: Name
    result: Any
    created_at: float


class Document(_Strict):
    format: Literal["harness-run"]
    schema_version: Literal[1]
    manifest: Manifest
    run: RunDoc
    steps: list[StepDoc]
    events: list[EventDoc]
    tool_records: list[ToolRecordDoc]


@dataclass(frozen=True)
class ImportResult:
    """What an import did: ``imported`` False means the run was already there."""

    run_id: str
    imported: bool
    status: RunStatus

    def to_dict(self) -> dict[str, JSON]:
        return {"run_id": self.run_id, "imported": self.imported}

    @property
    def line(self) -> str:
        done = "imported" if self.imported else "already imported"
        return f"{self.run_id} {done} ({self.status})"


# -- export ----------------------------------------------------------------------


def export_run(store: Store, run_id: str, now: datetime | None = None) -> dict[str, JSON]:
    """The run as an export document, read in one snapshot. Raises RunNotFound."""
    rows = store.run_rows(run_id)
    exported_at = (now or datetime.now(UTC)).isoformat(timespec="milliseconds")
    document: dict[str, JSON] = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "manifest": {
            "exported_at": exported_at.replace("+00:00", "Z"),
            "harness_version": _harness_version(),
            "counts": {
                "steps": len(rows.steps),
                "events": len(rows.events),
                "tool_records": len(rows.tool_records),
            },
        },
        "run": dict(rows.run),
        "steps": [dict(r) for r in rows.steps],
        "events": [dict(r) for r in rows.events],
        "tool_records": [dict(r) for r in rows.tool_records],
    }
    # As any reader can take it, whatever a row holds (harness.inputs.readable):
    # NaN from an older release is null, nesting beyond the limit cut.
    document = readable(document)
    # The hash first, for a reader of the file; it covers the rest of the manifest.
    document["manifest"] = {"sha256": content_hash(document), **document["manifest"]}
    return document


def dumps(document: Mapping[str, JSON], compact: bool = False) -> bytes:
    """The document as ASCII JSON, indented unless ``compact``, in its own
    order (manifest first, columns in table order); the hash is the same
    whatever the layout. ASCII, not UTF-8: a lone surrogate (a tool may return
    one) is written as its escape, which any reader decodes."""
    if compact:
        text = json.dumps(document, separators=(",", ":"))
    else:
        text = json.dumps(document, indent=2)
    return (text + "\n").encode("ascii")


def save(document: Mapping[str, JSON], path: str, compact: bool = False) -> None:
    """Write the document to ``path`` whole or not at all: a temporary file in
    the same directory (so the rename is atomic), synced, then renamed over
    ``path``. On any failure the temporary file is removed. Raises
    ExportFailed (one line) if the file cannot be written."""
    target = Path(path)
    data = dumps(document, compact)
    try:
        write_atomically(target, data)
    except OSError as err:
        raise ExportFailed(f"cannot write {path}: {err.strerror or err}") from None


def content_hash(document: Mapping[str, Any]) -> str:
    """The hex SHA-256 of the canonical JSON of everything but ``manifest.sha256``:
    sorted keys, no spaces, ASCII (docs/EXPORT.md)."""
    manifest = document.get("manifest")
    body = dict(document)
    if isinstance(manifest, Mapping):
        body["manifest"] = {k: v for k, v in manifest.items() if k != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _harness_version() -> str:
    try:
        return metadata.version("celery-agent-harness")
    except metadata.PackageNotFoundError:
        return "unknown"


# -- import ----------------------------------------------------------------------


def import_run(store: Store, source: str | bytes | Mapping[str, Any]) -> ImportResult:
    """Validate an export document (its text, or the parsed object) and write
    its run in one transaction. Idempotent. Raises BadArchive (nothing
    written), ImportConflict (the id is taken by other content)."""
    document = validate(source)
    rows = _rows(document)
    _check_text(rows)
    run_id = document.run.run_id
    try:
        inserted = store.import_run(rows)
    except UnicodeEncodeError as err:  # _check_text's miss; the transaction rolled back
        raise BadArchive(f"text the database cannot hold: {err.reason}") from None
    if inserted:
        return ImportResult(run_id, True, document.run.status)
    present = store.run_rows(run_id)
    for section in ("run", "steps", "events", "tool_records"):
        if _section(present, section) != _section(rows, section):
            raise ImportConflict(
                f"run {run_id} is already in this store with other content "
                f"(its {section.replace('_', ' ')} differ): not overwritten"
            )
    return ImportResult(run_id, False, RunStatus(present.run["status"]))


def read_source(path: str) -> bytes:
    """The bytes of the document at ``path``, for :func:`import_run`."""
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise BadArchive(f"cannot read {path}: {err.strerror or err}") from None


def validate(source: str | bytes | Mapping[str, Any]) -> Document:
    """The document, checked as the module docstring lists. Raises BadArchive."""
    raw = _parse(source) if isinstance(source, str | bytes) else dict(source)
    _check_header(raw)
    if content_hash(raw) != raw["manifest"]["sha256"]:
        raise BadArchive("tampered or corrupted: the content hash does not match the manifest")
    try:
        document = Document.model_validate(raw)
    except ValidationError as err:
        raise BadArchive(f"invalid document: {_describe(err)}") from None
    _check_counts(document)
    _check_consistent(document)
    _check_state(document)
    return document


def _parse(source: str | bytes) -> Any:
    try:
        text = source.decode("utf-8") if isinstance(source, bytes) else source
    except UnicodeDecodeError as err:
        raise BadArchive(f"not UTF-8 text (byte {err.start})") from None
    if not text.strip():
        raise BadArchive("the document is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BadArchive(
            f"not valid JSON at line {err.lineno} column {err.colno}: {err.msg} "
            "(truncated or damaged?)"
        ) from None


def _check_header(raw: Any) -> None:
    """Format, version and a hash to check, before anything else is read."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise BadArchive(f"not a harness run export (format {found!r}, expected {FORMAT!r})")
    version = raw.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BadArchive(f"unknown schema_version {version!r}, this one reads {SCHEMA_VERSION}")
    if version > SCHEMA_VERSION:
        raise BadArchive(
            f"written by a newer harness: schema_version {version}, this one reads {SCHEMA_VERSION}"
        )
    manifest = raw.get("manifest")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("sha256"), str):
        raise BadArchive("no content hash: manifest.sha256 is missing")


def _describe(err: ValidationError) -> str:
    errors = err.errors(include_url=False)
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or 'document'}: {e['msg']}"
        for e in errors[:_SHOWN_ERRORS]
    ]
    more = len(errors) - _SHOWN_ERRORS
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _check_counts(doc: Document) -> None:
    counts = doc.manifest.counts
    for section, said, found in (
        ("steps", counts.steps, len(doc.steps)),
        ("events", counts.events, len(doc.events)),
        ("tool_records", counts.tool_records, len(doc.tool_records)),
    ):
        if said != found:
            raise BadArchive(
                f"counts do not match: the manifest says {said} {section}, the document has {found}"
            )


def _check_consistent(doc: Document) -> None:
    """One run, whole: its steps 0..N-1, rows of no other run, records of its steps."""
    run, n = doc.run, len(doc.steps)
    owners = [(f"step {s.idx}", s.run_id) for s in doc.steps]
    owners += [(f"event {i}", e.run_id) for i, e in enumerate(doc.events)]
    owners += [(f"tool record {r.key!r}", r.run_id) for r in doc.tool_records]
    for what, run_id in owners:
        if run_id != run.run_id:
            raise BadArchive(f"{what} belongs to run {run_id!r}, not {run.run_id!r}")
    for position, step in enumerate(doc.steps):
        if step.idx != position:
            raise BadArchive(
                f"step indexes must be 0..{n - 1} in order: index {step.idx} at position {position}"
            )
    if run.step_count != n or run.cursor > n:
        raise BadArchive(
            f"the run says {run.step_count} steps (cursor {run.cursor}), the document has {n}"
        )
    if (run.forked_from_run is None) != (run.forked_from_step is None):
        raise BadArchive("forked_from_run and forked_from_step go together")
    if run.forked_from_step is not None and run.forked_from_step >= n:
        raise BadArchive(
            f"forked_from_step {run.forked_from_step} is not a step of the run (it has {n})"
        )
    if run.replay_of_run is None and run.replay_live_reads:
        raise BadArchive("replay_live_reads is set on a run that is not a replay")
    for i, event in enumerate(doc.events):
        if event.step_index is not None and event.step_index >= n:
            raise BadArchive(f"event {i} names step {event.step_index}, which the run lacks")
    keys: set[str] = set()
    for record in doc.tool_records:
        if record.key != f"{run.run_id}:{record.step_index}" or record.step_index >= n:
            raise BadArchive(f"tool record {record.key!r} is not the key of a step of this run")
        if record.key in keys:
            raise BadArchive(f"tool record {record.key!r} appears twice")
        keys.add(record.key)


def _check_state(doc: Document) -> None:
    """A state the engine can reach, so the run neither sticks nor loops once
    imported: steps before the cursor settled, ``running``
    only at it; a run that moves or is held has an unsettled step at its
    cursor (else workers find "no runnable step" and the sweeper re-sends it
    forever); a tool step names its tool, a model step none."""
    # created_at and updated_at are not compared: they come from different
    # machines' clocks (the starter's, the last worker's), which may disagree.
    run, steps = doc.run, doc.steps
    for step in steps:
        where = f"step {step.idx} ({step.kind.value}, {step.status.value})"
        if (step.kind is StepKind.TOOL) != (step.tool is not None):
            need = "names no tool" if step.tool is None else f"names a tool ({step.tool!r})"
            raise BadArchive(f"{where} {need}")
        if step.idx < run.cursor and not step.status.settled:
            raise BadArchive(f"{where} is before the cursor {run.cursor}: not done or failed")
        if step.status is StepStatus.RUNNING and step.idx != run.cursor:
            raise BadArchive(f"{where} is not at the cursor {run.cursor}")
    if run.status.terminal:
        return
    if run.cursor >= len(steps):
        raise BadArchive(
            f"a {run.status.value} run has no step at its cursor {run.cursor} "
            f"(it has {len(steps)}): nothing could run next"
        )
    if steps[run.cursor].status.settled:
        raise BadArchive(
            f"a {run.status.value} run's step at its cursor {run.cursor} "
            f"is already {steps[run.cursor].status.value}: nothing could run next"
        )


def _check_text(rows: RunRows) -> None:
    """Every plain-text column encodes as UTF-8: a lone surrogate (which JSON
    can carry as an escape) cannot be stored there. JSON columns can hold one:
    they are stored re-serialised, escaped."""
    sections = (
        ("run", schema.runs.name, (rows.run,)),
        ("step", schema.steps.name, rows.steps),
        ("event", schema.events.name, rows.events),
        ("tool record", schema.tool_results.name, rows.tool_records),
    )
    for what, table, table_rows in sections:
        json_columns = schema.JSON_COLUMNS.get(table, ())
        for i, row in enumerate(table_rows):
            for column, value in row.items():
                if column in json_columns or not isinstance(value, str):
                    continue
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as err:
                    at = "" if what == "run" else f" {i}"
                    raise BadArchive(
                        f"{what}{at} {column}: not text a database can hold "
                        f"({err.reason} at character {err.start})"
                    ) from None


def _rows(doc: Document) -> RunRows:
    """The rows to write: the document's, with the lease cleared (see the docstring)."""
    run = _row(doc.run)
    run["owner"] = None
    run["lease_expires_at"] = None
    if doc.run.status.movable and run["wake_at"] is None:
        run["wake_at"] = run["updated_at"]
    return RunRows(
        run,
        tuple(_row(s) for s in doc.steps),
        tuple(_row(e) for e in doc.events),
        tuple(_row(r) for r in doc.tool_records),
    )


def _row(model: BaseModel) -> dict[str, Any]:
    """Column name to value; statuses as their strings. Not pydantic's JSON
    mode, which would turn a NaN inside a result into null."""
    return {k: v.value if isinstance(v, Enum) else v for k, v in model.model_dump().items()}


def _section(rows: RunRows, section: str) -> Any:
    value: Any = getattr(rows, section)
    return dict(value) if section == "run" else [dict(r) for r in value]
