"""The run store in this process's memory: the reference backend for tests.

:class:`MemoryStore` implements the whole :class:`harness.store.Store`
protocol with the semantics of :class:`harness.store.sql.SQLStore`, and
passes the same contract suite (tests/contract), as the langgraph
checkpoint packages ship an in-memory saver beside their databases: unit
tests of the engine need no database. It is thread-safe (one lock, each
method one transaction) and keeps nothing after the process ends; nothing
configures it from the environment: a caller builds one and passes it in
(``harness.api.use_store``, ``tests/rig.py``).

- :mod:`~harness.store.memory.rows`: rows shaped as the SQL tables hold
  them, through the same boundary (harness.inputs).
- :mod:`~harness.store.memory.tables`: the tables and the lock.
- :mod:`~harness.store.memory.runs`: runs, checkpoints, claims, reads, due
  runs, writes beside the version.
- :mod:`~harness.store.memory.archives`: export, import, fork, prune.
- :mod:`~harness.store.memory.upkeep`: tool records, lanes, sweeps, counts,
  the agent catalog.
- :mod:`~harness.store.memory.streams`: runs' streams.
- :mod:`~harness.store.memory.offered`: the tools each run was offered.
"""

from __future__ import annotations

from harness.store import Store
from harness.store.memory.archives import MemoryArchives
from harness.store.memory.offered import MemoryOfferedTools
from harness.store.memory.streams import MemoryStreams
from harness.store.memory.upkeep import MemoryUpkeep
from harness.store.memory.waits import MemoryWaits

__all__ = ["MemoryStore"]


class MemoryStore(MemoryArchives, MemoryUpkeep, MemoryWaits, MemoryStreams, MemoryOfferedTools):
    """:class:`harness.store.Store` in memory, with SQLStore's semantics."""


#: Held by mypy: a MemoryStore is a Store, every method of the protocol alike.
STORE: type[Store] = MemoryStore
