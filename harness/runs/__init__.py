"""What is done to whole runs, beside carrying them forward.

Modules:

- ``fork``: ``harness fork``, a new run that copies another's recorded steps
  before a model turn (never executing them again) and goes on live from it.
- ``archive``: ``harness export`` / ``harness import``, a run with its steps,
  tool records and flight recorder as one versioned, hashed JSON document
  (format reference: docs/EXPORT.md); ``document`` is that document's
  model, ``admission`` what an imported run may be before any row is written.
- ``prune``: ``harness prune``, retention: deletes old finished runs with
  their steps, events and tool records, in short batches, keeping the fork
  ancestors of every run it keeps.
"""
