"""Replay: a recorded run run again under another agent, for evaluation.

Modules:

- ``rerun``: ``harness replay``, a new run of a recorded run's goal whose
  tool calls are served from the recording (the engine's cassette,
  harness.engine.cassette) instead of being made again.
- ``report``: the comparison of a replay with its recording: the first
  divergence, the answers, the token and cost deltas; one table for a batch.
"""
