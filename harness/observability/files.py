"""The metric files one worker process writes: prometheus_client's
multiprocess format, written without touching prometheus_client's globals.

prometheus_client's own multiprocess mode is process-wide: it picks its
value class from ``PROMETHEUS_MULTIPROC_DIR`` and sends every metric of the
process there. A user's own metrics in a pool child (or a tool's subprocess
inheriting the variable) would then land in ``HARNESS_METRICS_DIR``. So the
harness writes its few metrics itself, through prometheus_client's
:class:`MmapedDict` (the file format :class:`MultiProcessCollector` reads),
and leaves ``ValueClass`` and the environment alone.

Two hazards of memory-mapped files are handled here:

* **A full disk.** The files are mapped, and a sparse file's page is only
  allocated when first written: on a full filesystem that write is a
  ``SIGBUS`` that kills the worker right after it committed a checkpoint.
  Every page is allocated up front (``posix_fallocate``) before it is mapped,
  and again before a new label set would make the file grow; a refusal
  (``ENOSPC``, a read-only or missing directory) is an :class:`OSError`
  raised before anything is mapped, and the caller turns measuring off.
* **Two writers of one file.** Files are named after a pool slot so that a
  recycled child counts on in its predecessor's files; two live processes
  with one slot name (two workers started with the same ``-n`` on one host)
  would lose counts and corrupt the file. Each slot name is held with an
  exclusive ``flock`` on ``<name>.lock`` for the process's life (the kernel
  drops it when the process dies, so the replacement child takes the slot);
  a process that finds its name held takes ``<name>+1``, ``<name>+2``...
"""

from __future__ import annotations

import fcntl
import math
import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.utils import floatToGoString

#: Bytes allocated for each file when it is opened: room for about 4,000
#: label sets, so the files normally never grow (prometheus_client starts at 64 KiB).
PREALLOCATED = 1 << 20
#: Alternative names tried when a slot's name is held by a live process.
SPARE_NAMES = 16
TYPES = ("counter", "histogram")
_header = struct.Struct("i")


class SlotFiles:
    """This process's counter and histogram files under one slot name, held
    with a lock. Thread-safe (the threads pool). :func:`close` releases all."""

    def __init__(self, directory: Path, identifier: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.identifier, self._lock_fd = _lock_a_name(directory, identifier)
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}
        self._dicts: dict[str, MmapedDict] = {}
        self._keys: set[str] = set()
        try:
            for typ in TYPES:
                path = directory / f"{typ}_{self.identifier}.db"
                self._fds[typ] = fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                os.posix_fallocate(fd, 0, max(PREALLOCATED, os.fstat(fd).st_size))
                self._dicts[typ] = MmapedDict(str(path))  # type: ignore[no-untyped-call]
        except BaseException:
            self.close()
            raise

    def add(
        self, typ: str, metric: Family, sample: str, labels: dict[str, str], amount: float
    ) -> None:
        """Add ``amount`` to a sample of ``metric`` (``typ``: counter or
        histogram). Raises OSError if a new label set needs room the
        filesystem refuses."""
        key = mmap_key(
            metric.name, sample, list(labels), list(labels.values()), metric.documentation
        )
        with self._lock:
            values = self._dicts[typ]
            if key not in self._keys:
                self._make_room(typ, key)
                self._keys.add(key)
            value, _ = values.read_value(key)  # type: ignore[no-untyped-call]
            values.write_value(key, value + amount, 0.0)  # type: ignore[no-untyped-call]

    def _make_room(self, typ: str, key: str) -> None:
        """Allocate the file's next pages before MmapedDict grows it (sparse)."""
        fd = self._fds[typ]
        (used,) = _header.unpack(os.pread(fd, _header.size, 0))
        size = os.fstat(fd).st_size
        entry = 4 + len(key.encode()) + 8 + 16  # length, key, padding (at most), two doubles
        if used + entry > size:
            os.posix_fallocate(fd, 0, size * 2)

    def close(self) -> None:
        """Unmap the files and release the slot's name."""
        for values in self._dicts.values():
            values.close()  # type: ignore[no-untyped-call]
        for fd in (*self._fds.values(), self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._dicts.clear()
        self._fds.clear()
        self._lock_fd = -1


def _lock_a_name(directory: Path, identifier: str) -> tuple[str, int]:
    """The first of ``identifier``, ``identifier+1``... whose lock is free,
    with the open lock file; ``identifier+pid<pid>`` if all are held."""
    names = [identifier, *(f"{identifier}+{n}" for n in range(1, SPARE_NAMES))]
    for name in [*names, f"{identifier}+pid{os.getpid()}"]:
        fd = os.open(directory / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        return name, fd
    raise BlockingIOError(f"every metrics file name of {identifier} is held")


@dataclass(frozen=True)
class Family:
    """A metric with labels, written to a :class:`SlotFiles`."""

    name: str
    documentation: str
    labelnames: tuple[str, ...]

    def labels(self, labelvalues: Sequence[str]) -> dict[str, str]:
        return dict(zip(self.labelnames, labelvalues, strict=True))


@dataclass(frozen=True)
class CounterFile(Family):
    """A counter: one ``_total`` sample per label set."""

    def inc(self, files: SlotFiles, labelvalues: Sequence[str], amount: float = 1.0) -> None:
        files.add("counter", self, self.name + "_total", self.labels(labelvalues), amount)

    def create(self, files: SlotFiles, labelvalues: Sequence[str]) -> None:
        """Write this label set at zero, so its pages are allocated now."""
        self.inc(files, labelvalues, 0.0)


@dataclass(frozen=True)
class HistogramFile(Family):
    """A histogram, written as MultiProcessCollector expects: ``_sum``, and
    per bucket the observations that fell in it (not cumulative: the
    collector accumulates them and derives ``_count``)."""

    buckets: tuple[float, ...] = ()

    def observe(self, files: SlotFiles, labelvalues: Sequence[str], amount: float) -> None:
        labels = self.labels(labelvalues)
        files.add("histogram", self, self.name + "_sum", labels, amount)
        bound = next((b for b in self.buckets if amount <= b), math.inf)
        self._bucket(files, labels, bound, 1.0)

    def create(self, files: SlotFiles, labelvalues: Sequence[str]) -> None:
        """Write this label set's samples at zero, so their pages are allocated now."""
        labels = self.labels(labelvalues)
        files.add("histogram", self, self.name + "_sum", labels, 0.0)
        for bound in (*self.buckets, math.inf):
            self._bucket(files, labels, bound, 0.0)

    def _bucket(self, files: SlotFiles, labels: dict[str, str], bound: float, n: float) -> None:
        le = {**labels, "le": floatToGoString(bound)}  # type: ignore[no-untyped-call]
        files.add("histogram", self, self.name + "_bucket", le, n)
