"""Every run is a record: what can be done with a finished (or moving) run.

Modules:

- ``fork``: ``harness fork``, a new run that copies another's recorded steps
  before a model turn (never executing them again) and goes on live from it.
- ``archive``: ``harness export`` / ``harness import``, a run with its steps,
  tool records and flight recorder as one versioned, hashed JSON document
  (format reference: docs/EXPORT.md).
- ``prune``: ``harness prune``, retention: deletes old finished runs with
  their steps, events and tool records, in short batches, keeping the fork
  ancestors of every run it keeps.
"""
