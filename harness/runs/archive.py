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
     "tool_records": [{every column of harness_tool_results}, ...],  by step
     "signals": [{every column of harness_signals but id}, ...],  oldest first;
                                                   only for a run that has any
     "offered_tools": {toolset: [tool, ...]}}      the tools its toolsets offered
                                                   it (harness_run_tools); only
                                                   for a run that has the record

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
refused: this harness cannot know what it added); no value nested deeper
than harness.inputs.MAX_DEPTH; the content hash; every field's type and
bounds, no unknown field (pydantic, strict); text and JSON values a column
can hold; the counts; then the run itself, as harness.runs.admission
reads it (a recomputed hash proves nothing, so these are the gate against a
document that would strand the run or act for an operator): one run, whole;
a state the engine can reach; operators' words only where they were acted
on. Then one transaction writes every row
(:meth:`harness.store.Store.import_run`).

The run arrives as it was except for what belonged to the exporting
deployment: its lease (owner and lease_expires_at cleared), its schedule (a
movable run, pending or running, or one waiting on deferred calls, is due at
the import's time, any other held or finished one has no wake-up; a run not
finished has no re-sends yet) and
the words of its operators on calls not yet made (dropped: an operator here
decides). A terminal run stays terminal. A run already present with the same
content is "already imported"; with other content it is an
:class:`ImportConflict`, never an overwrite.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from harness.atomic import write_atomically
from harness.errors import BadArchive, ExportFailed, ImportConflict
from harness.inputs import MAX_DEPTH, checked_json, readable
from harness.records import JSON, RunStatus
from harness.runs import admission
from harness.runs.document import Document
from harness.store import Archives, RunRows

FORMAT = "harness-run"
SCHEMA_VERSION = 1


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


def export_run(store: Archives, run_id: str, now: datetime | None = None) -> dict[str, JSON]:
    """The run as an export document, read in one snapshot. Raises RunNotFound."""
    rows = store.run_rows(run_id)
    exported_at = (now or datetime.now(UTC)).isoformat(timespec="milliseconds")
    counts: dict[str, JSON] = {
        "steps": len(rows.steps),
        "events": len(rows.events),
        "tool_records": len(rows.tool_records),
    }
    document: dict[str, JSON] = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "manifest": {
            "exported_at": exported_at.replace("+00:00", "Z"),
            "harness_version": _harness_version(),
            "counts": counts,
        },
        "run": dict(rows.run),
        "steps": [dict(r) for r in rows.steps],
        "events": [dict(r) for r in rows.events],
        "tool_records": [dict(r) for r in rows.tool_records],
    }
    if rows.signals:  # only then: a run without signals exports as before 0014
        document["signals"] = [dict(r) for r in rows.signals]
        counts["signals"] = len(rows.signals)
    if rows.offered_tools is not None:  # as signals: a run of an agent with toolsets
        document["offered_tools"] = rows.offered_tools
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


def import_run(
    store: Archives, source: str | bytes | Mapping[str, Any], now: float | None = None
) -> ImportResult:
    """Validate an export document (its text, or the parsed object) and write
    its run in one transaction. Idempotent. ``now``: this store's time, when
    a moving run is due. Raises BadArchive (nothing written), ImportConflict
    (the id is taken by other content)."""
    document = validate(source)
    rows = _rows(document, time.time() if now is None else now)
    run_id = document.run.run_id
    try:
        inserted = store.import_run(rows)
    except UnicodeEncodeError as err:  # check_values' miss; the transaction rolled back
        raise BadArchive(f"text the database cannot hold: {err.reason}") from None
    if inserted:
        return ImportResult(run_id, True, document.run.status)
    present = store.run_rows(run_id)
    for section in ("run", "steps", "events", "tool_records", "signals", "offered_tools"):
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
    admission.check_nesting(raw)
    try:
        found = content_hash(raw)
    except (TypeError, ValueError) as err:  # a dict from Python holding what JSON cannot say
        raise BadArchive(f"not JSON: {err}") from None
    if found != raw["manifest"]["sha256"]:
        raise BadArchive("tampered or corrupted: the content hash does not match the manifest")
    try:
        document = Document.model_validate(raw)
    except ValidationError as err:
        raise BadArchive(f"invalid document: {admission.describe(err)}") from None
    admission.check_values(document)
    _check_counts(document)
    admission.check_consistent(document)
    admission.check_state(document)
    admission.check_approvals(document)
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
    except ValueError as err:  # an integer literal too long for Python to read
        raise BadArchive(f"not valid JSON: {str(err).split(';')[0]}") from None
    except RecursionError:
        raise BadArchive(
            "nested too deeply to read: no value in an export is nested deeper than "
            f"{MAX_DEPTH} levels"
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


def _check_counts(doc: Document) -> None:
    counts = doc.manifest.counts
    for section, said, found in (
        ("steps", counts.steps, len(doc.steps)),
        ("events", counts.events, len(doc.events)),
        ("tool_records", counts.tool_records, len(doc.tool_records)),
        ("signals", counts.signals, len(doc.signals)),
    ):
        if said != found:
            raise BadArchive(
                f"counts do not match: the manifest says {said} {section}, the document has {found}"
            )


def _rows(doc: Document, now: float) -> RunRows:
    """The rows to write: the document's, but for what was the exporting
    deployment's (see the module docstring), JSON values made storable."""
    run = _row(doc.run)
    run.update(owner=None, lease_expires_at=None)
    # Its clock set the wake-up, and its sweeper counted the re-sends. A run
    # waiting on deferred calls is due at once too: the sweeper gives what is
    # due its timeout and sets the next look (harness.engine.waits.sweep);
    # without a wake-up it would never be looked at.
    run["wake_at"] = now if doc.run.status.movable or admission.waits_on_calls(doc) else None
    if not doc.run.status.terminal:
        run["resends"] = 0
    steps = []
    for step in doc.steps:
        row = _row(step)
        row["approval"] = admission.carried_approval(step)
        for column in ("args", "result", "approval"):
            row[column] = checked_json(row[column], f"steps.{step.idx}.{column}")
        steps.append(row)
    records = []
    for i, record in enumerate(doc.tool_records):
        row = _row(record)
        row["result"] = checked_json(row["result"], f"tool_records.{i}.result")
        records.append(row)
    signals = []
    for i, signal in enumerate(doc.signals):
        row = _row(signal)
        row["data"] = checked_json(row["data"], f"signals.{i}.data")
        signals.append(row)
    events = tuple(_row(e) for e in doc.events)
    offered = None
    if doc.offered_tools is not None:
        offered = checked_json(
            {
                name: [t.model_dump(by_alias=True) for t in tools]
                for name, tools in doc.offered_tools.items()
            },
            "offered_tools",
        )
    return RunRows(run, tuple(steps), events, tuple(records), tuple(signals), offered)


def _row(model: BaseModel) -> dict[str, Any]:
    """Column name to value; statuses as their strings. Not pydantic's JSON
    mode, which would turn a NaN inside a result into null."""
    return {k: v.value if isinstance(v, Enum) else v for k, v in model.model_dump().items()}


def _section(rows: RunRows, section: str) -> Any:
    """A section of the rows as compared with a present run's: a moving
    run's wake-up is the time of its import, not content."""
    value: Any = getattr(rows, section)
    if section == "run":
        return {k: v for k, v in value.items() if k != "wake_at"}
    if section == "offered_tools":
        return value
    return [dict(r) for r in value]
