"""Blobs: results too large for their rows, stored beside them.

A step's result and an idempotency record's result (a tool's output; a
model's response, under the model record) are JSON text in their rows. When
that text is longer than the threshold (``HARNESS_BLOB_THRESHOLD`` bytes, 64
KiB by default; 0: never) the row keeps a reference instead: ``result`` is
NULL and ``result_blob`` names the text by its SHA-256, ``"sha256:<hex>"``.
A column of its own, so a reference is never mistaken for a result: a tool
may return any JSON, ``{"$blob": ...}`` included, and it is stored as it is.
A run's rows stay small whatever its tools return, and a tool step's result
and its idempotency record, the same text, are stored once.

Where the text goes:

- **The table** ``harness_blobs`` (the default): a row keyed (run_id,
  digest), inserted in the transaction of the write that names it (on
  PostgreSQL inside the checkpoint's one statement), so a checkpoint that
  loses its compare-and-swap leaves no blob behind.
- **A directory** (``HARNESS_BLOB_DIR``, shared by every worker): the row's
  ``data`` is NULL and the text is the file ``<dir>/<run>/<hex>.json``, made
  whole (a temporary file, synced, renamed, the folder synced) before the
  transaction that names it begins. The name is the content's hash, so a
  retry finds the file there; a write that fails after it leaves a file no
  row names, harmless, which :meth:`BlobStore.orphans` lists.

Every blob belongs to one run, so retention and copies stay row operations:
a prune deletes a run's blobs in its batch transaction (and the run's folder
after the commit); a fork and an import write their values as a checkpoint
does, so the new run gets blobs of its own; an export reads them inline (the
format is unchanged).

Reads resolve references transparently, one query per read and run
(``WHERE run_id = ... AND digest IN (...)``). How a blob is read does not
depend on the settings in force: one written under another threshold, or
with blobs since turned off, reads back the same; a file, as long as
``HARNESS_BLOB_DIR`` points at its directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection

from harness.atomic import write_atomically
from harness.errors import ConfigError, RunNotFound, StoreError
from harness.settings import DEFAULT_BLOB_THRESHOLD
from harness.store import schema

log = logging.getLogger(__name__)

#: Bytes of JSON text above which a result is stored as a blob (HARNESS_BLOB_THRESHOLD).
DEFAULT_THRESHOLD = DEFAULT_BLOB_THRESHOLD
#: The column naming a row's blob (``harness_steps``, ``harness_tool_results``).
REF = "result_blob"
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
#: Digests per ``IN`` list (SQLite's bound parameters are limited).
_PER_STATEMENT = 500
#: Longest folder name kept readable; a longer run id is hashed.
_NAME_MAX = 200


def digest_of(data: bytes) -> str:
    """A blob's name: ``"sha256:<hex>"`` of its bytes."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def run_folder(run_id: str) -> str:
    """A run's folder in the blob directory: its id, percent-encoded so that
    any id is one safe name (no ``/``, no leading ``.``); ``+`` and a hash for
    an id too long (``+`` is never left by the encoding, so never clashes)."""
    name = quote(run_id, safe="").replace(".", "%2E")
    if len(name) <= _NAME_MAX:
        return name
    return f"+{hashlib.sha256(run_id.encode()).hexdigest()}"


@dataclass
class BlobBatch:
    """The blobs that one write's rows name, gathered while they are encoded."""

    threshold: int | None
    texts: dict[tuple[str, str], str] = field(default_factory=dict)

    def offload(self, run_id: str, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` (a step's, a record's, a step patch's values) with its JSON
        ``result`` moved to a blob of ``run_id`` if longer than the threshold.
        A row that sets ``result`` sets ``result_blob`` too, NULL when the
        result is inline, so a small result written later drops a reference."""
        if "result" not in row:
            return row
        text = row["result"]
        if text is None or self.threshold is None or len(text) <= self.threshold:
            return {**row, REF: None}
        digest = digest_of(text.encode())
        self.texts[(run_id, digest)] = text
        return {**row, "result": None, REF: digest}


@dataclass(frozen=True)
class BlobStore:
    """Where a store puts results longer than ``threshold`` bytes of JSON
    (None: nowhere, every result stays in its row): the table, or files in
    ``directory``; and how it reads them back."""

    threshold: int | None = DEFAULT_THRESHOLD
    directory: Path | None = None

    def batch(self) -> BlobBatch:
        """An empty batch for the rows of one write."""
        return BlobBatch(self.threshold)

    def check(self) -> None:
        """Make the directory if it is missing; ConfigError if it cannot be
        written, said now rather than at the first large result."""
        if self.directory is None:
            return
        where = f"HARNESS_BLOB_DIR={str(self.directory)!r}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"{where}: cannot create it ({err.strerror or err})") from None
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise ConfigError(f"{where}: not writable by this process")

    # -- writes ----------------------------------------------------------------

    def stage(self, batch: BlobBatch) -> tuple[dict[str, Any], ...]:
        """The blob rows a write inserts with its rows. With a directory each
        file is written now, durably, before that write's transaction.
        Raises StoreError if a file cannot be written."""
        rows = []
        for (run_id, digest), text in batch.texts.items():
            data = text.encode()
            if self.directory is not None:
                self._write_file(run_id, digest, data)
            stored = None if self.directory is not None else text
            rows.append({"run_id": run_id, "digest": digest, "size": len(data), "data": stored})
        return tuple(rows)

    def insert(self, conn: Connection, dialect: str, rows: Sequence[dict[str, Any]]) -> None:
        """Insert staged blob rows in the caller's transaction (kept if the run has them)."""
        if rows:
            conn.execute(schema.insert_blobs_if_absent(dialect), list(rows))

    def _write_file(self, run_id: str, digest: str, data: bytes) -> None:
        path = self._path(run_id, digest)
        folder = path.parent
        try:
            if path.exists():  # whole: only a rename puts a file there
                # Named from now on: not to be taken for an old orphan by its age.
                os.utime(path)
            else:
                made = not folder.is_dir()
                folder.mkdir(parents=True, exist_ok=True)
                if made:
                    _sync(folder.parent)
                write_atomically(path, data)
            # The rename durable before any row names the file (also when a
            # crashed attempt renamed it and died before this sync).
            _sync(folder)
        except OSError as err:
            raise StoreError(f"cannot write blob {path}: {err.strerror or err}") from err

    # -- reads -----------------------------------------------------------------

    def fill(
        self, conn: Connection, rows: Sequence[Mapping[Any, Any]], prefix: str = ""
    ) -> list[Mapping[Any, Any]]:
        """``rows`` with every blob reference's text put in ``result`` (the
        columns ``prefix + "result"``, ``prefix + "result_blob"``): one query
        per run named (and per 500 digests). Raises RunNotFound if the run
        was deleted (pruned) while it was read, StoreError if a blob is lost."""
        ref, result, owner = f"{prefix}{REF}", f"{prefix}result", f"{prefix}run_id"
        wanted: dict[str, set[str]] = {}
        for row in rows:
            if row[ref] is not None:
                wanted.setdefault(row[owner], set()).add(row[ref])
        if not wanted:
            return list(rows)
        texts: dict[tuple[str, str], str] = {}
        for run_id, digests in wanted.items():
            texts |= self._texts(conn, run_id, sorted(digests))
        return [
            row if row[ref] is None else {**row, result: texts[(row[owner], row[ref])]}
            for row in rows
        ]

    def _texts(
        self, conn: Connection, run_id: str, digests: list[str]
    ) -> dict[tuple[str, str], str]:
        found: dict[tuple[str, str], str] = {}
        for start in range(0, len(digests), _PER_STATEMENT):
            chunk = digests[start : start + _PER_STATEMENT]
            for digest, data in conn.execute(schema.select_blobs(run_id, chunk)).all():
                text = data if data is not None else self._read_file(conn, run_id, digest)
                found[(run_id, digest)] = text
        missing = [d for d in digests if (run_id, d) not in found]
        if missing:
            _gone(conn, run_id)
            raise StoreError(f"run {run_id}: blob {missing[0]} is missing from harness_blobs")
        return found

    def _read_file(self, conn: Connection, run_id: str, digest: str) -> str:
        if self.directory is None:
            raise StoreError(
                f"run {run_id}: blob {digest} is a file in a blob directory, and "
                "HARNESS_BLOB_DIR is not set here: set it to that directory"
            )
        path = self._path(run_id, digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            _gone(conn, run_id)
            raise StoreError(f"run {run_id}: blob file {path} is missing") from None
        except OSError as err:
            raise StoreError(f"cannot read blob {path}: {err.strerror or err}") from err
        if digest_of(data) != digest:
            raise StoreError(f"run {run_id}: blob file {path} is damaged (its hash differs)")
        return data.decode()

    def _path(self, run_id: str, digest: str) -> Path:
        assert self.directory is not None
        match = _DIGEST.fullmatch(digest)
        if match is None:
            raise StoreError(f"run {run_id}: {digest!r} is not a blob name")
        return self.directory / run_folder(run_id) / f"{match[1]}.json"

    # -- retention -------------------------------------------------------------

    def remove(self, run_ids: Iterable[str]) -> None:
        """Remove the folders of runs deleted (and committed): their files.
        A failure is logged, never raised: the runs are gone, the files are
        orphans (harmless, listed by :meth:`orphans`)."""
        if self.directory is None:
            return
        for run_id in run_ids:
            folder = self.directory / run_folder(run_id)
            try:
                shutil.rmtree(folder)
            except FileNotFoundError:
                continue
            except OSError as err:
                log.warning("blob files of deleted run %s left in %s: %s", run_id, folder, err)

    def orphans(self, conn: Connection) -> list[Path]:
        """Files in the blob directory that no blob row names: left by a write
        that failed after its file was written, a prune stopped before removing
        its files, a reset. Harmless; a file of a write still in flight (a
        step running now) is listed too, so delete only older ones."""
        if self.directory is None or not self.directory.is_dir():
            return []
        named = {self._path(r, d) for r, d in conn.execute(schema.select_blob_files()).all()}
        return sorted(
            path
            for folder in self.directory.iterdir()
            if folder.is_dir()
            for path in folder.iterdir()
            if path not in named
        )


def _gone(conn: Connection, run_id: str) -> None:
    """RunNotFound if the run was deleted (pruned) while its blobs were read."""
    if conn.execute(schema.run_version(run_id)).first() is None:
        raise RunNotFound(run_id)


def _sync(folder: Path) -> None:
    """Make the names in ``folder`` durable (a rename, a new entry)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
